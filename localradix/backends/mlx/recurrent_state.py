"""MLXRecurrentStates: a hybrid model's per-request linear-attention state on MLX, and its
snapshots for the radix cache (the MLX runner's `StateSnapshots`; twin of
model_api/recurrent_state.py, without torch).

Each gated delta-net layer keeps, per request-table row, the last `kernel - 1` inputs of its
causal convolution (model dtype) and a [heads, key_dim, value_dim] recurrent state (float32),
as one MLX array per layer over every row. A step reads and rewrites its requests' rows through
a `StepPlan` of MLX index arrays; the runner evaluates the arrays with the step's tokens, so the
lazy graph stays one step deep. `save(row)` copies a row out as fresh arrays (a slice would keep
the whole buffer alive), `restore` copies one in (or zeroes the row), `export` / `adopt` turn a
snapshot into bytes and back for the cache tiers, in the torch runner's byte layout. Each row
counts the tokens its state holds; a step that does not continue exactly there raises.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from localradix.model_api.recurrent_plan import RecurrentLayout, StepPlan, advance_rows
from localradix.step import ForwardBatch


@dataclass(frozen=True)
class Snapshot:
    conv: mx.array  # [layers, kernel - 1, channels]
    recurrent: mx.array  # [layers, heads, key_dim, value_dim] float32
    tokens: int
    nbytes: int


def _ints(array: Any) -> mx.array:
    return mx.array(np.ascontiguousarray(array, dtype=np.int32))


class MLXRecurrentStates:
    """`conv[layer]` [rows, kernel - 1, channels], `recurrent[layer]` [rows, heads, key_dim,
    value_dim] float32, the current step's `plan`, and snapshots of rows."""

    def __init__(self, layout: RecurrentLayout, rows: int, dtype: mx.Dtype, budget: int):
        self.layout, self.budget, self.dtype = layout, budget, dtype
        conv = (rows, layout.conv_kernel - 1, layout.conv_channels)
        recurrent = (rows, layout.heads, layout.key_dim, layout.value_dim)
        self.conv = [mx.zeros(conv, dtype=dtype) for _ in range(layout.layers)]
        self.recurrent = [mx.zeros(recurrent, dtype=mx.float32) for _ in range(layout.layers)]
        mx.eval(self.arrays())
        self.tokens = np.zeros(rows, dtype=np.int64)  # tokens each row's state has folded in
        self.plan: StepPlan | None = None
        self._saved: dict[int, Snapshot] = {}
        self._ids = itertools.count(1)

    def arrays(self) -> list[mx.array]:
        """The state arrays, for the step's `mx.eval`."""
        return self.conv + self.recurrent

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())

    # ---- StateSnapshots ----------------------------------------------------------------------

    def save(self, row: int) -> tuple[int, int]:
        conv = mx.stack([c[row] for c in self.conv])  # stacked: fresh buffers, not views
        recurrent = mx.stack([r[row] for r in self.recurrent])
        mx.eval(conv, recurrent)
        handle, nbytes = next(self._ids), conv.nbytes + recurrent.nbytes
        self._saved[handle] = Snapshot(conv, recurrent, int(self.tokens[row]), nbytes)
        return handle, nbytes

    def restore(self, row: int, handle: int | None) -> None:
        # Copied in now, not at the step: the cache may release the handle before it runs.
        snap = None if handle is None else self._saved[handle]
        for layer in range(self.layout.layers):
            conv, recurrent = self.conv[layer], self.recurrent[layer]
            conv[row] = 0 if snap is None else snap.conv[layer]
            recurrent[row] = 0 if snap is None else snap.recurrent[layer]
        mx.eval(self.arrays())
        self.tokens[row] = 0 if snap is None else snap.tokens

    def release(self, handle: int) -> None:
        del self._saved[handle]

    @property
    def live(self) -> int:
        return len(self._saved)

    # ---- StateTransfer (the cache tiers below the tree) ---------------------------------------

    def export(self, handle: int) -> np.ndarray:
        """uint8 [bytes]: a snapshot's conv state, then its recurrent state."""
        snap = self._saved[handle]
        parts = [np.array(a.view(mx.uint8)).reshape(-1) for a in (snap.conv, snap.recurrent)]
        return np.concatenate(parts)

    def adopt(self, data: np.ndarray, tokens: int) -> tuple[int, int]:
        """A snapshot of the state `export` gave (after `tokens` tokens): (handle, bytes)."""
        conv_shape = (self.layout.layers, *self.conv[0].shape[1:])
        recurrent_shape = (self.layout.layers, *self.recurrent[0].shape[1:])
        conv_bytes = int(np.prod(conv_shape)) * self.dtype.size
        if len(data) != conv_bytes + int(np.prod(recurrent_shape)) * 4:
            raise ValueError(f"a state of {len(data)} bytes is not this model's")
        raw = np.ascontiguousarray(data, dtype=np.uint8)
        conv = mx.array(raw[:conv_bytes]).view(self.dtype).reshape(conv_shape)
        recurrent = mx.array(raw[conv_bytes:]).view(mx.float32).reshape(recurrent_shape)
        mx.eval(conv, recurrent)
        handle = next(self._ids)
        self._saved[handle] = Snapshot(conv, recurrent, tokens, len(data))
        return handle, len(data)

    # ---- what the runner calls ---------------------------------------------------------------

    def prepare(self, batch: ForwardBatch) -> StepPlan:
        """Check each request continues its row's state, and plan the step (`self.plan`)."""
        advance_rows(self.tokens, batch)
        self.plan = StepPlan.of(batch, self.layout.conv_kernel - 1, _ints)
        return self.plan
