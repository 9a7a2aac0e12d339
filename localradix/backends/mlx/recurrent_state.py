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

from localradix.step import ForwardBatch


@dataclass(frozen=True)
class MLXRecurrentLayout:
    """The state one request keeps in each linear-attention layer."""

    layers: int
    conv_channels: int  # q, k and v channels the causal conv runs over
    conv_kernel: int
    heads: int  # value heads
    key_dim: int
    value_dim: int

    @classmethod
    def for_model(cls, c: Any) -> MLXRecurrentLayout | None:
        """The layout of a `ModelConfig` with gated delta-net layers; None without any."""
        layers = sum(bool(x) for x in getattr(c, "linear_layers", ()))
        if not layers:
            return None
        keys = c.linear_key_heads * c.linear_key_head_dim
        channels = 2 * keys + c.linear_value_heads * c.linear_value_head_dim
        return cls(
            layers,
            channels,
            c.linear_conv_kernel,
            c.linear_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        )

    def row_bytes(self, dtype: mx.Dtype) -> int:
        """One row's state over every layer (conv in `dtype`, recurrent in float32)."""
        conv = (self.conv_kernel - 1) * self.conv_channels * dtype.size
        return self.layers * (conv + self.heads * self.key_dim * self.value_dim * 4)


@dataclass(frozen=True)
class StepPlan:
    """Where a step's requests keep their state and where their tokens lie (as on torch).

    The conv runs over one flat buffer of `ext_len` rows: per request, its saved conv inputs
    (`state_at`) then its new tokens (`token_at`); token t's window starts at `conv_at[t]`, and
    the request's next conv state is the last kernel - 1 rows of its part (`tail_at`).
    One-token requests take one batched recurrent step (`single_*`), longer ones the chunked
    form one by one (`segments`: row, first token, token count)."""

    rows: mx.array  # [N]
    token_at: mx.array  # [T]
    conv_at: mx.array  # [T]
    state_at: mx.array  # [N * (kernel - 1)]
    tail_at: mx.array  # [N * (kernel - 1)]
    ext_len: int
    single_rows: mx.array | None
    single_tokens: mx.array | None
    segments: tuple[tuple[int, int, int], ...]


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

    def __init__(self, layout: MLXRecurrentLayout, rows: int, dtype: mx.Dtype, budget: int):
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
        self.plan = _plan(batch, rows, self.layout.conv_kernel - 1)
        return self.plan


def _plan(batch: ForwardBatch, rows: np.ndarray, width: int) -> StepPlan:
    n, lens, starts = batch.num_reqs, batch.extend_lens, batch.qo_indptr[:-1]
    request = np.repeat(np.arange(n, dtype=np.int64), lens)
    token_at = np.arange(batch.num_tokens, dtype=np.int64) + width * (request + 1)
    begins = starts + width * np.arange(n, dtype=np.int64)  # each request's part
    state_at = (begins[:, None] + np.arange(width)).ravel()
    tail_at = (begins[:, None] + lens[:, None] + np.arange(width)).ravel()
    single = np.flatnonzero(lens == 1)
    segments = tuple((int(rows[i]), int(starts[i]), int(lens[i])) for i in np.flatnonzero(lens > 1))
    return StepPlan(
        rows=_ints(rows),
        token_at=_ints(token_at),
        conv_at=_ints(token_at - width),
        state_at=_ints(state_at),
        tail_at=_ints(tail_at),
        ext_len=batch.num_tokens + n * width,
        single_rows=_ints(rows[single]) if single.size else None,
        single_tokens=_ints(starts[single]) if single.size else None,
        segments=segments,
    )
