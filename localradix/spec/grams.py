"""N-gram hashing shared by the context index and the tree snapshot."""

from __future__ import annotations

import numpy as np

__all__ = ["gram_hashes"]

_MUL = np.uint64(0x9E3779B97F4A7C15)  # odd: every token of a gram moves its hash


def gram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """uint64 hash of every n-gram of `tokens` (entry i: the gram ending at i + n - 1).

    Different grams may collide: callers compare the tokens before trusting a match.
    """
    t = np.asarray(tokens).astype(np.uint64)  # -1 (a separator) wraps to no token's value
    h = np.zeros(max(len(t) - n + 1, 0), dtype=np.uint64)
    for j in range(n):
        h = h * _MUL + t[j : len(t) - n + 1 + j]
    return h
