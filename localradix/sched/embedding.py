"""Embedding requests in the scheduler: prefill only, pooled chunk by chunk, then done.

The runner pools each prefill chunk (`ForwardBatch.pooling`); `add_chunk` folds a chunk's
pooled state into the request and `vector` turns the whole prompt's into the answer. A
mean-pooled request matches no cached prefix (every token's hidden state is needed); a
last-token one uses the radix cache like any prompt. Either leaves its prompt cached.
"""

from __future__ import annotations

import numpy as np

from localradix.messages import Embed


def add_chunk(total: np.ndarray | None, chunk: np.ndarray, embed: Embed) -> np.ndarray:
    """The pooled state so far after one more chunk: its last token's, or the sum of all."""
    if embed.pooling == "mean" and total is not None:
        return total + chunk
    return chunk.astype(np.float32, copy=True)


def vector(total: np.ndarray, prompt_tokens: int, embed: Embed) -> tuple[float, ...]:
    """The embedding of a prompt whose chunks are all in (mean divided, L2-normalised if asked)."""
    out = total / prompt_tokens if embed.pooling == "mean" else total
    if embed.normalize:
        out = out / max(float(np.linalg.norm(out)), 1e-12)
    return tuple(float(x) for x in out)
