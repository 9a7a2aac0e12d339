"""The framework-free half of a hybrid model's per-request recurrent state: its layout, the
check that each step continues every row where its state is, and the step's index plan.

`model_api/recurrent_state.py` (torch) and `backends/mlx/recurrent_state.py` (MLX) hold the
state buffers and snapshots; both plan a step here and convert the plan's index arrays to their
own framework (`StepPlan.of(batch, width, to_index)`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

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

    def row_bytes(self, itemsize: int) -> int:
        """Bytes of one row's state over every layer (conv in the model's dtype of `itemsize`
        bytes, recurrent in float32)."""
        conv = (self.conv_kernel - 1) * self.conv_channels * itemsize
        return self.layers * (conv + self.heads * self.key_dim * self.value_dim * 4)


@dataclass(frozen=True)
class StepPlan:
    """Where one step's requests keep their state and where their tokens lie, as index arrays
    of the state's framework.

    The causal conv runs over one flat buffer of `ext_len` rows holding, per request, its saved
    conv inputs then its new tokens' (`state_at`, `token_at`); a token's conv output is the
    window ending at it (`conv_at`: where the window starts), the request's next conv state the
    last kernel - 1 rows of its part (`tail_at`). One-token requests (decodes) take one
    vectorised recurrent step (`single_*`); longer ones run the chunked form one by one
    (`segments`: request row, first token, token count)."""

    rows: Any  # [N] request rows
    token_at: Any  # [T]
    conv_at: Any  # [T]
    state_at: Any  # [N * (kernel - 1)]
    tail_at: Any  # [N * (kernel - 1)]
    ext_len: int
    single_rows: Any | None  # rows of the one-token requests ...
    single_tokens: Any | None  # ... and their tokens
    segments: tuple[tuple[int, int, int], ...]

    @classmethod
    def of(cls, batch: ForwardBatch, width: int, to_index: Callable[[np.ndarray], Any]) -> StepPlan:
        """The plan of `batch` (whose `req_rows` are set) for a conv keeping `width` inputs."""
        assert batch.req_rows is not None
        rows, n = batch.req_rows, batch.num_reqs
        lens, starts = batch.extend_lens, batch.qo_indptr[:-1]
        request = np.repeat(np.arange(n, dtype=np.int64), lens)
        token_at = np.arange(batch.num_tokens, dtype=np.int64) + width * (request + 1)
        begins = starts + width * np.arange(n, dtype=np.int64)  # each request's part
        state_at = (begins[:, None] + np.arange(width)).ravel()
        tail_at = (begins[:, None] + lens[:, None] + np.arange(width)).ravel()
        single = np.flatnonzero(lens == 1)
        longer = np.flatnonzero(lens > 1)
        return cls(
            rows=to_index(rows),
            token_at=to_index(token_at),
            conv_at=to_index(token_at - width),
            state_at=to_index(state_at),
            tail_at=to_index(tail_at),
            ext_len=batch.num_tokens + n * width,
            single_rows=to_index(rows[single]) if single.size else None,
            single_tokens=to_index(starts[single]) if single.size else None,
            segments=tuple((int(rows[i]), int(starts[i]), int(lens[i])) for i in longer),
        )


def advance_rows(tokens: np.ndarray, batch: ForwardBatch) -> None:
    """Check each request of `batch` continues its row's state exactly where it is (`tokens`:
    tokens each row has folded in), then move the rows on to the step's end."""
    if batch.req_rows is None:
        raise ValueError("a model with recurrent layers needs each request's row")
    if batch.num_sampled is not None:
        raise ValueError("a recurrent state cannot take back rejected draft tokens")
    rows = batch.req_rows
    if rows.max(initial=-1) >= len(tokens):
        raise ValueError(f"request row {int(rows.max())} is past the {len(tokens)} rows")
    held, prefix = tokens[rows], batch.prefix_lens
    wrong = np.flatnonzero(held != prefix)
    if wrong.size:
        i = int(wrong[0])
        raise RuntimeError(
            f"request row {int(rows[i])} holds the state after {int(held[i])} tokens, its step "
            f"continues after {int(prefix[i])}"
        )
    tokens[rows] = batch.seq_lens
