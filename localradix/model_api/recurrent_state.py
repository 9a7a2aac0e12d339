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

from localradix.step import ForwardBatch


@dataclass(frozen=True)
class RecurrentLayout:
    """The state one request keeps in each linear-attention layer."""

    layers: int  # linear-attention layers
    conv_channels: int  # q, k and v channels the causal conv runs over
    conv_kernel: int  # the conv's width (it keeps the last kernel - 1 inputs)
    heads: int  # value heads (the recurrent state's)
    key_dim: int
    value_dim: int

    @classmethod
    def for_model(cls, config: Any) -> RecurrentLayout | None:
        """The layout of a `ModelConfig` with gated delta-net layers; None without any."""
        c = config
        layers = sum(bool(x) for x in getattr(c, "linear_layers", ()))
        if not layers:
            return None
        keys = c.linear_key_heads * c.linear_key_head_dim
        values = c.linear_value_heads * c.linear_value_head_dim
        return cls(
            layers,
            2 * keys + values,
            c.linear_conv_kernel,
            c.linear_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        )

    def row_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of one row's state over every layer (conv in `dtype`, recurrent in float32)."""
        conv = (self.conv_kernel - 1) * self.conv_channels * dtype.itemsize
        return self.layers * (conv + self.heads * self.key_dim * self.value_dim * 4)


@dataclass(frozen=True)
class StepPlan:
    """Where one step's requests keep their state and where their tokens lie.

    The causal conv runs over one flat buffer of `ext_len` rows holding, per request, its saved
    conv inputs then its new tokens' (`state_at`, `token_at`); a token's conv output is the
    window ending at it (`conv_at`: where the window starts), the request's next conv state the
    last kernel - 1 rows of its part (`tail_at`). One-token requests (decodes) take one
    vectorised recurrent step (`single_*`); longer ones run the chunked form one by one
    (`segments`: request row, first token, token count)."""

    rows: torch.Tensor  # [N] request rows
    token_at: torch.Tensor  # [T]
    conv_at: torch.Tensor  # [T]
    state_at: torch.Tensor  # [N * (kernel - 1)]
    tail_at: torch.Tensor  # [N * (kernel - 1)]
    ext_len: int
    single_rows: torch.Tensor | None  # rows of the one-token requests ...
    single_tokens: torch.Tensor | None  # ... and their tokens
    segments: tuple[tuple[int, int, int], ...]


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
        if batch.req_rows is None:
            raise ValueError("a model with recurrent layers needs each request's row")
        if batch.num_sampled is not None:
            raise ValueError("a recurrent state cannot take back rejected draft tokens")
        rows = batch.req_rows
        if rows.max(initial=-1) >= len(self.tokens):
            raise ValueError(f"request row {int(rows.max())} is past the {len(self.tokens)} rows")
        held, prefix = self.tokens[rows], batch.prefix_lens
        wrong = np.flatnonzero(held != prefix)
        if wrong.size:
            i = int(wrong[0])
            raise RuntimeError(
                f"request row {int(rows[i])} holds the state after {int(held[i])} tokens, its "
                f"step continues after {int(prefix[i])}"
            )
        self.tokens[rows] = batch.seq_lens
        self.plan = self._plan(batch)
        return self.plan

    def _plan(self, batch: ForwardBatch) -> StepPlan:
        n, width = batch.num_reqs, self.layout.conv_kernel - 1
        lens, starts = batch.extend_lens, batch.qo_indptr[:-1]
        request = np.repeat(np.arange(n, dtype=np.int64), lens)
        token_at = np.arange(batch.num_tokens, dtype=np.int64) + width * (request + 1)
        begins = starts + width * np.arange(n, dtype=np.int64)  # each request's part
        state_at = (begins[:, None] + np.arange(width)).ravel()
        tail_at = (begins[:, None] + lens[:, None] + np.arange(width)).ravel()
        single = np.flatnonzero(lens == 1)
        segments = tuple(
            (int(batch.req_rows[i]), int(starts[i]), int(lens[i]))  # type: ignore[index]
            for i in np.flatnonzero(lens > 1)
        )
        rows = self._tensor(batch.req_rows)
        return StepPlan(
            rows=rows,
            token_at=self._tensor(token_at),
            conv_at=self._tensor(token_at - width),
            state_at=self._tensor(state_at),
            tail_at=self._tensor(tail_at),
            ext_len=batch.num_tokens + n * width,
            single_rows=rows[self._tensor(single)] if single.size else None,
            single_tokens=self._tensor(starts[single]) if single.size else None,
            segments=segments,
        )

    def _tensor(self, array: Any) -> torch.Tensor:
        data = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))
        return data.to(self.device, non_blocking=True)
