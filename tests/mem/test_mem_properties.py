"""Property tests: random insert / match / lock / unlock / evict / alloc / free sequences.

The reference model is a flat map `(namespace, key prefix) -> slot`, one entry per cached
token, plus the set of positions locked by live requests. After every step the cache must agree
with it (exactly, or as a legal eviction of it) and `check_invariants` must hold, so no slot is
ever freed twice (the pool would raise) or leaked (the invariant would fail).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from localradix.mem import KVPool, RadixCache, SlotError, TreeNode, check_invariants

# One cached token: namespace, the key up to the end of its page (pages with different tokens
# never share a node), and its index.
Pos = tuple[str | None, tuple[int, ...], int]

# Keys grow from a few shared stems so prefixes (and whole pages) are often shared.
STEMS = ([0] * 12, [0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 0, 0], [1, 2] * 6)
tails = st.lists(st.integers(0, 2), max_size=6)
keys = st.builds(
    lambda s, cut, tail: STEMS[s][:cut] + tail, st.integers(0, 2), st.integers(0, 12), tails
)
namespaces = st.sampled_from([None, "t"])
picks = st.integers(0, 10_000)


@dataclass
class Live:
    """A request in flight: tree prefix (locked via `node`) + its own slots after it."""

    key: np.ndarray
    ns: str | None
    node: TreeNode
    prefix: np.ndarray  # slots of key[:matched], owned by the tree
    own: np.ndarray  # whole pages owned by the request, for key[matched:] (+ padding)

    @property
    def matched(self) -> int:
        return len(self.prefix)


def positions(ns: str | None, key: np.ndarray | tuple[int, ...], upto: int, page: int) -> list[Pos]:
    items = tuple(key.tolist()) if isinstance(key, np.ndarray) else key
    return [(ns, items[: (i // page + 1) * page], i) for i in range(upto)]


def tree_map(cache: RadixCache) -> dict[Pos, int]:
    """The cache's contents in the reference model's shape, read without touching stats."""
    out: dict[Pos, int] = {}
    stack: list[tuple[TreeNode, tuple[int, ...]]] = [(c, ()) for c in cache.root.children.values()]
    while stack:
        node, above = stack.pop()
        path = above + tuple(node.key.tolist())
        where = positions(node.extra_key, path, len(path), cache.page_size)[len(above) :]
        out.update(zip(where, node.value.tolist(), strict=True))
        stack.extend((child, path) for child in node.children.values())
    return out


class CacheMachine(RuleBasedStateMachine):
    @initialize(
        page=st.sampled_from([1, 2, 4]), policy=st.sampled_from(["lru", "lfu", "fifo", "priority"])
    )
    def setup(self, page: int, policy: str) -> None:
        self.page = page
        self.pool = KVPool(48, page)
        self.cache = RadixCache(self.pool, page, policy)
        self.ref: dict[Pos, int] = {}
        self.live: list[Live] = []
        self.raw: list[np.ndarray] = []

    # ---- reference helpers ------------------------------------------------------------

    def truncated(self, key: list[int] | np.ndarray) -> np.ndarray:
        key = np.asarray(key, dtype=np.int64)
        return key[: len(key) // self.page * self.page]

    def ref_match(self, ns: str | None, key: np.ndarray) -> list[int]:
        slots = []
        for pos in positions(ns, key, len(key), self.page):
            if pos not in self.ref:
                break
            slots.append(self.ref[pos])
        return slots[: len(slots) // self.page * self.page]  # the cache matches whole pages

    def locked(self) -> set[Pos]:
        return {p for r in self.live for p in positions(r.ns, r.key, r.matched, self.page)}

    def evictable(self) -> int:
        return len(self.ref) - len(self.locked())

    def sync_after_eviction(self) -> None:
        actual = tree_map(self.cache)
        assert actual.items() <= self.ref.items(), "eviction invented or moved slots"
        assert self.locked() <= actual.keys(), "a locked prefix was evicted"
        self.ref = actual

    def can_fit(self, n: int) -> bool:
        return n <= self.pool.available + self.evictable()

    # ---- rules ------------------------------------------------------------------------

    @rule(key=keys, ns=namespaces)
    def match(self, key: list[int], ns: str | None) -> None:
        arr = np.asarray(key, dtype=np.int64)
        result = self.cache.match_prefix(arr, ns)
        expected = self.ref_match(ns, self.truncated(arr))
        assert result.indices.tolist() == expected
        assert result.matched_len == len(expected) == self.path_len(result.last_node)
        div = result.divergence
        if result.matched_len == len(arr):
            assert div is None
        else:
            assert div is not None and div.position >= result.matched_len
            assert div.request_token == key[div.position]
            assert div.cached_token != div.request_token

    @rule(key=keys, ns=namespaces)
    def admit(self, key: list[int], ns: str | None) -> None:
        arr = np.asarray(key, dtype=np.int64)
        match = self.cache.match_prefix(arr, ns)
        self.cache.lock(match.last_node)
        req = Live(arr, ns, match.last_node, match.indices, np.zeros(0, np.int64))
        self.live.append(req)
        need = -(-(len(arr) - match.matched_len) // self.page) * self.page
        fits = self.can_fit(need)
        own = self.pool.alloc(need)
        assert (own is not None) == fits
        self.sync_after_eviction()
        if own is None:
            self.live.pop()
            self.cache.unlock(match.last_node)
        else:
            req.own = own

    @rule(pick=picks, priority=st.integers(0, 3))
    def finish(self, pick: int, priority: int) -> None:
        if not self.live:
            return
        req = self.live.pop(pick % len(self.live))
        slots = np.concatenate([req.prefix, req.own])
        whole = len(self.truncated(req.key))
        expected = len(self.ref_match(req.ns, req.key[:whole]))
        already = self.cache.insert(req.key[:whole], slots[:whole], req.ns, priority)
        assert already == expected >= req.matched
        self.pool.free(slots[req.matched : already])
        self.pool.free(slots[whole:])
        for i, pos in enumerate(
            positions(req.ns, req.key, whole, self.page)[already:], start=already
        ):
            self.ref[pos] = int(slots[i])
        self.cache.unlock(req.node)
        assert tree_map(self.cache) == self.ref

    @rule(key=keys, ns=namespaces)
    def insert_fresh(self, key: list[int], ns: str | None) -> None:
        """Insert with fresh slots and no prior match or lock (e.g. a warm-up)."""
        arr = self.truncated(key)
        slots = self.pool.alloc(len(arr))
        self.sync_after_eviction()
        if slots is None:
            return
        expected = len(self.ref_match(ns, arr))
        assert self.cache.insert(arr, slots, ns) == expected
        self.pool.free(slots[:expected])
        for i, pos in enumerate(positions(ns, arr, len(arr), self.page)[expected:], start=expected):
            self.ref[pos] = int(slots[i])
        assert tree_map(self.cache) == self.ref

    @rule(pick=picks)
    def checkpoint(self, pick: int) -> None:
        """Cache a running request's computed prefix and move its lock (chunked prefill)."""
        if not self.live:
            return
        req = self.live[pick % len(self.live)]
        whole = len(self.truncated(req.key))
        slots = np.concatenate([req.prefix, req.own])
        already = self.cache.insert(req.key[:whole], slots[:whole], req.ns)
        self.pool.free(slots[req.matched : already])
        for i, pos in enumerate(
            positions(req.ns, req.key, whole, self.page)[already:], start=already
        ):
            self.ref[pos] = int(slots[i])
        match = self.cache.match_prefix(req.key[:whole], req.ns)
        assert match.matched_len == whole
        self.cache.lock(match.last_node)
        self.cache.unlock(req.node)
        req.node, req.prefix, req.own = match.last_node, match.indices, slots[whole:]

    @rule(n=st.integers(0, 60))
    def evict(self, n: int) -> None:
        before = self.evictable()
        freed = self.cache.evict(n)
        assert freed <= before
        assert freed >= n if before >= n else freed == before
        self.sync_after_eviction()

    @rule(pages=st.integers(0, 8))
    def alloc(self, pages: int) -> None:
        n = pages * self.page
        fits = self.can_fit(n)
        slots = self.pool.alloc(n)
        assert (slots is not None) == fits
        self.sync_after_eviction()
        if slots is not None:
            self.raw.append(slots)

    @rule(pick=picks)
    def free(self, pick: int) -> None:
        if self.raw:
            self.pool.free(self.raw.pop(pick % len(self.raw)))

    @rule(pick=picks)
    def double_free_is_refused(self, pick: int) -> None:
        free = self.pool.free_slots()
        if not free.size:
            return
        slot = int(free[pick % free.size])
        page = self.pool.pages_to_slots(np.array([slot // self.page]))
        with pytest.raises(SlotError):
            self.pool.free(page)

    # ---- after every step -------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        owned = [r.own for r in self.live] + self.raw
        check_invariants(self.pool, self.cache, idle=not self.live, owned=owned)
        locked = len(self.locked())
        assert self.cache.protected_size == locked
        assert self.cache.evictable_size == len(self.ref) - locked
        for req in self.live:
            assert self.path_len(req.node) == req.matched
            assert req.node.lock_ref >= 1 or req.node is self.cache.root

    def path_len(self, node: TreeNode) -> int:
        n = 0
        while node is not self.cache.root:
            n += len(node.key)
            assert node.parent is not None
            node = node.parent
        return n


CacheMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestCacheMachine = CacheMachine.TestCase
