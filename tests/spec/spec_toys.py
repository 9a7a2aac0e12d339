"""Shared helpers for the speculative-decoding tests: a real pool + radix cache, and a tiny
deterministic "model" whose next-token distribution depends on the last two tokens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localradix.mem import KVPool, RadixCache, check_invariants


class Cache:
    """A pool and its radix cache, filled the way the scheduler caches a finished request."""

    def __init__(self, size: int = 4096, page_size: int = 1) -> None:
        self.pool = KVPool(size, page_size)
        self.cache = RadixCache(self.pool, page_size)

    def put(self, tokens: Sequence[int], extra_key: str | None = None) -> None:
        key = np.asarray(tokens, dtype=np.int64)
        match = self.cache.match_prefix(key, extra_key)
        own = self.pool.alloc(len(key) - match.matched_len)
        assert own is not None, "test pool too small"
        slots = np.concatenate([match.indices, own])
        already = self.cache.insert(key, slots, extra_key)
        self.pool.free(slots[match.matched_len : already])
        check_invariants(self.pool, self.cache, idle=True)


class ToyModel:
    """p(next | context) from the last two tokens: random logits, and one token per context
    disallowed (probability 0, as a grammar mask would make it)."""

    def __init__(self, vocab: int, seed: int = 0, sharpness: float = 1.5) -> None:
        self.vocab = vocab
        rng = np.random.default_rng(seed)
        logits = rng.normal(size=(vocab + 1, vocab + 1, vocab)) * sharpness
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        banned = rng.integers(0, vocab, size=(vocab + 1, vocab + 1))
        np.put_along_axis(probs, banned[..., None], 0.0, axis=-1)
        self.table = probs / probs.sum(axis=-1, keepdims=True)

    def probs(self, context: Sequence[int]) -> np.ndarray:
        a = context[-2] if len(context) >= 2 else self.vocab
        b = context[-1] if len(context) >= 1 else self.vocab
        return self.table[a, b]

    def rows(self, context: Sequence[int], drafts: Sequence[int]) -> np.ndarray:
        """The k + 1 distributions a verify step sees: after context + drafts[:i]."""
        ctx = list(context)
        out = []
        for i in range(len(drafts) + 1):
            out.append(self.probs(ctx + list(drafts[:i])))
        return np.array(out)
