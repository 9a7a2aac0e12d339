"""Shared helpers for the memory tests: a pool+cache pair and a request-like `put`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from localradix.mem import KVPool, RadixCache, check_invariants


class Mem:
    """A pool and its cache, with the scheduler's way of caching a finished request."""

    def __init__(self, size: int, page_size: int = 1, policy: str = "lru", disable: bool = False):
        self.pool = KVPool(size, page_size)
        self.cache = RadixCache(self.pool, page_size, policy, disable)

    def put(self, tokens: Sequence[int], extra_key: str | None = None, priority: int = 0) -> int:
        """Match, allocate the rest, insert, free duplicates; return the already-cached length."""
        key = np.asarray(tokens, dtype=np.int64)
        match = self.cache.match_prefix(key, extra_key)
        own = self.pool.alloc(len(key) - match.matched_len)
        assert own is not None, "test pool too small"
        slots = np.concatenate([match.indices, own])
        already = self.cache.insert(key, slots, extra_key, priority)
        self.pool.free(slots[match.matched_len : already])
        self.check()
        return already

    def paths(self) -> set[tuple[str | None, tuple[int, ...]]]:
        """Every cached root-to-leaf key, read without touching access stats."""
        out = set()
        for node in self.cache.iter_nodes():
            if not node.children:
                parts, up = [], node
                while up.parent is not None:
                    parts.append(up.key.tolist())
                    up = up.parent
                out.add((node.extra_key, tuple(t for part in reversed(parts) for t in part)))
        return out

    def keys(self) -> set[tuple[int, ...]]:
        return {key for _, key in self.paths()}

    def check(self, **kwargs: object) -> None:
        check_invariants(self.pool, self.cache, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def mem() -> Callable[..., Mem]:
    return Mem
