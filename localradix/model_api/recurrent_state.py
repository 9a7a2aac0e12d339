"""RecurrentStates: the per-request state of a hybrid model's linear-attention layers, and its
snapshots for the radix cache (the torch runner's `StateSnapshots`).

A gated delta-net layer (Qwen3.5) folds every token into two tensors per request: the last
`kernel - 1` inputs of its causal convolution and a [heads, key_dim, value_dim] recurrent
state. Unlike KV they cannot be cut back to a prefix, so:
- each request-table row owns one set of buffers for every linear layer, preallocated for the
  scheduler's rows (`max_running_requests + 2`); `prepare(batch)` turns a step's rows and
  token segments into a `StepPlan` the layers read and write through;
- `save(row)` copies a row's state out as a snapshot (host memory: the snapshot budget is the
  host's), which the radix cache hangs on the node ending where the row's tokens end;
  `restore(row, handle)` copies one in, or zeroes the row for a request starting from no tokens,
  before the row's next step; `release` forgets it;
- each row counts the tokens its state has folded in, and a step must continue exactly there
  (a broken scheduler contract raises instead of computing from a wrong state).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from localradix.model_api.recurrent_plan import RecurrentLayout, StepPlan, advance_rows
from localradix.step import ForwardBatch


@dataclass(frozen=True)
class Snapshot:
    conv: torch.Tensor  # [layers, kernel - 1, channels]
    recurrent: torch.Tensor  # [layers, heads, key_dim, value_dim] float32
    tokens: int  # tokens the state has folded in
    nbytes: int


class RecurrentStates:
    """Per-row buffers `conv[layer]` [rows, kernel - 1, channels] (model dtype) and
    `recurrent[layer]` [rows, heads, key_dim, value_dim] (float32), the current step's `plan`,
    and snapshots of rows (`StateSnapshots`)."""

    def __init__(
        self,
        layout: RecurrentLayout,
        rows: int,
        dtype: torch.dtype,
        device: torch.device | str,
        budget: int,
    ) -> None:
        self.layout, self.device, self.budget = layout, torch.device(device), budget
        width = layout.conv_kernel - 1
        self.conv = torch.zeros(
            layout.layers, rows, width, layout.conv_channels, dtype=dtype, device=device
        )
        shape = (layout.layers, rows, layout.heads, layout.key_dim, layout.value_dim)
        self.recurrent = torch.zeros(shape, dtype=torch.float32, device=device)
        self.tokens = np.zeros(rows, dtype=np.int64)  # tokens each row's state has folded in
        self.plan: StepPlan | None = None
        self._saved: dict[int, Snapshot] = {}
        self._ids = itertools.count(1)

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.recurrent.nbytes

    # ---- StateSnapshots ----------------------------------------------------------------------

    def save(self, row: int) -> tuple[int, int]:
        conv = self.conv[:, row].to("cpu", copy=True)
        recurrent = self.recurrent[:, row].to("cpu", copy=True)
        handle = next(self._ids)
        nbytes = conv.nbytes + recurrent.nbytes
        self._saved[handle] = Snapshot(conv, recurrent, int(self.tokens[row]), nbytes)
        return handle, nbytes

    def restore(self, row: int, handle: int | None) -> None:
        # Copied in now, not at the step: the cache may release the handle before it runs.
        if handle is None:
            self.conv[:, row].zero_()
            self.recurrent[:, row].zero_()
            self.tokens[row] = 0
            return
        snap = self._saved[handle]
        self.conv[:, row].copy_(snap.conv)
        self.recurrent[:, row].copy_(snap.recurrent)
        self.tokens[row] = snap.tokens

    def release(self, handle: int) -> None:
        del self._saved[handle]

    @property
    def live(self) -> int:
        return len(self._saved)

    # ---- StateTransfer (the cache tiers below the tree) ---------------------------------------

    def export(self, handle: int) -> np.ndarray:
        """uint8 [bytes]: a snapshot's conv state, then its recurrent state."""
        snap = self._saved[handle]
        parts = (snap.conv.contiguous(), snap.recurrent.contiguous())
        return np.concatenate([t.view(torch.uint8).reshape(-1).numpy() for t in parts])

    def adopt(self, data: np.ndarray, tokens: int) -> tuple[int, int]:
        """A snapshot of the state `export` gave (after `tokens` tokens): (handle, bytes)."""
        layers, rows = self.conv.shape[0], self.conv.shape[2:]
        conv_bytes = layers * int(np.prod(rows)) * self.conv.element_size()
        if len(data) != conv_bytes + self.recurrent[:, 0].nbytes:
            raise ValueError(f"a state of {len(data)} bytes is not this model's")
        raw = torch.from_numpy(np.array(data, dtype=np.uint8))  # a copy: the tiers' buffer
        conv = raw[:conv_bytes].view(self.conv.dtype).reshape(layers, *rows)
        recurrent = raw[conv_bytes:].view(torch.float32).reshape(self.recurrent[:, 0].shape)
        handle = next(self._ids)
        self._saved[handle] = Snapshot(conv, recurrent, tokens, len(data))
        return handle, len(data)

    # ---- what the runner calls ---------------------------------------------------------------

    def prepare(self, batch: ForwardBatch) -> StepPlan:
        """Check each request continues its row's state, and plan the step (`self.plan`)."""
        advance_rows(self.tokens, batch)
        self.plan = StepPlan.of(batch, self.layout.conv_kernel - 1, self._tensor)
        return self.plan

    def _tensor(self, array: Any) -> torch.Tensor:
        data = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))
        return data.to(self.device, non_blocking=True)
