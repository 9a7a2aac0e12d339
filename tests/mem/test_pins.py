"""Pins (Anthropic cache_control): a pinned prefix is never evicted until its deadline, renews on
a repeat, survives node splits, and keeps the accounting exact (pinned tokens are protected)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from localradix.mem import KVPool, RadixCache, check_invariants

MemFactory = Callable[..., Any]  # conftest.Mem
SYSTEM = list(range(100, 110))


def test_a_pinned_prefix_outlives_a_full_eviction(mem: MemFactory) -> None:
    m = mem(32)
    m.put([*SYSTEM, 1, 2])
    m.put([7, 8, 9])
    assert m.cache.pin(SYSTEM, deadline=10.0) == len(SYSTEM)
    assert m.cache.pinned_size == m.cache.protected_size == len(SYSTEM)
    m.check(idle=True)  # a pin is no leaked lock
    m.cache.evict(1000)
    assert m.keys() == {tuple(SYSTEM)}
    assert m.cache.match_prefix([*SYSTEM, 5]).matched_len == len(SYSTEM)
    m.check(idle=True)


def test_a_pin_expires_at_its_deadline_and_a_repeat_renews_it(mem: MemFactory) -> None:
    m = mem(32)
    m.put(SYSTEM)
    m.cache.pin(SYSTEM, deadline=10.0)
    m.cache.pin(SYSTEM, deadline=20.0)  # renewed: still one lock
    [node] = m.cache.pins
    assert node.direct_locks == 1 and m.cache.pins[node] == 20.0
    m.cache.pin(SYSTEM, deadline=15.0)  # an earlier deadline does not shorten it
    assert m.cache.unpin_expired(now=19.0) == 0
    assert m.cache.evict(1000) == 0
    assert m.cache.unpin_expired(now=20.0) == 1
    assert m.cache.pinned_size == m.cache.protected_size == 0
    m.check(idle=True)
    assert m.cache.evict(1000) == len(SYSTEM)
    m.check(idle=True)


def test_a_split_keeps_the_pin_on_the_same_tokens(mem: MemFactory) -> None:
    m = mem(32)
    m.put(SYSTEM)
    m.cache.pin(SYSTEM, deadline=10.0)
    m.put([*SYSTEM[:4], 1, 1])  # splits the pinned node: its upper half is a new node
    assert m.cache.pinned_size == len(SYSTEM)
    m.cache.evict(1000)
    assert m.keys() == {tuple(SYSTEM)}
    m.cache.unpin_expired(now=11.0)
    m.check(idle=True)
    assert m.cache.evict(1000) == len(SYSTEM)


def test_pinning_the_middle_of_a_node_pins_only_that_prefix(mem: MemFactory) -> None:
    m = mem(32)
    m.put([*SYSTEM, 1, 2, 3])
    assert m.cache.pin([*SYSTEM, 9], deadline=10.0) == len(SYSTEM)  # only what is cached
    assert m.cache.evict(1000) == 3
    assert m.keys() == {tuple(SYSTEM)}
    m.check(idle=True)


def test_a_request_lock_under_a_pin_is_told_apart(mem: MemFactory) -> None:
    m = mem(32)
    m.put(SYSTEM)
    m.cache.pin(SYSTEM, deadline=10.0)
    node = m.cache.match_prefix(SYSTEM).last_node
    m.cache.lock(node)  # a request running on the pinned prefix
    with pytest.raises(AssertionError, match="requests still lock"):
        m.check(idle=True)
    with pytest.raises(RuntimeError, match="requests hold"):
        m.cache.reset()
    m.cache.unlock(node)
    m.cache.reset()  # a flush drops pins too
    assert not m.cache.pins and m.cache.total_size == 0
    m.check(idle=True)


def test_the_budget_clips_a_pin(mem: MemFactory) -> None:
    m = mem(64)
    m.put([*SYSTEM, 1, 2, 3, 4])
    m.put([*SYSTEM, 5, 6, 7, 8])  # nodes: SYSTEM (10), [1, 2, 3, 4], [5, 6, 7, 8]
    assert m.cache.pin([*SYSTEM, 1, 2, 3, 4], 10.0, budget=12) == 12  # split inside [1, 2, ..]
    assert m.cache.pin([*SYSTEM, 5, 6, 7, 8], 10.0, budget=16) == 14  # SYSTEM already counted
    assert m.cache.pinned_size == 16
    assert m.cache.pin([*SYSTEM, 1, 2, 3, 4], 10.0, budget=16) == 12  # a renewal fits
    assert m.cache.pin([9, 9, 9], 10.0, budget=100) == 0  # nothing cached: nothing pinned
    m.put([9, 9, 9])
    assert m.cache.pin([9, 9, 9], 10.0, budget=16) == 0  # refused: the budget is full
    assert m.cache.pinned_size == 16
    m.check(idle=True)
    m.cache.evict(1000)
    assert m.keys() == {(*SYSTEM, 1, 2), (*SYSTEM, 5, 6, 7, 8)}


def test_a_clipped_pin_splits_on_a_page_boundary(mem: MemFactory) -> None:
    m = mem(64, page_size=4)
    m.put(list(range(2, 18)))  # one node of 16 tokens
    assert m.cache.pin(list(range(2, 18)), 10.0, budget=10) == 8
    m.check(idle=True)


def test_a_pin_on_a_disabled_cache_is_a_no_op(mem: MemFactory) -> None:
    m = mem(16, disable=True)
    assert m.cache.pin([1, 2, 3], deadline=10.0) == 0
    assert not m.cache.pins


def test_the_invariant_catches_an_evicted_pin(mem: MemFactory) -> None:
    m = mem(16)
    m.put([1, 2, 3])
    m.cache.pin([1, 2, 3], deadline=10.0)
    [node] = m.cache.pins
    m.cache.unlock(node)  # corrupt: the pin's lock is gone
    with pytest.raises(AssertionError, match="holds no lock"):
        m.check()


# ---- properties -------------------------------------------------------------------------------

STEMS = ([0] * 10, [0, 0, 1, 1, 2, 2, 0, 0, 1, 1], [1, 2] * 5)
keys = st.builds(
    lambda s, cut, tail: STEMS[s][:cut] + tail,
    st.integers(0, 2),
    st.integers(1, 10),
    st.lists(st.integers(0, 2), max_size=4),
)


class PinMachine(RuleBasedStateMachine):
    """Random insert / match / pin / lock / evict / expire sequences: the invariants hold after
    each, and a prefix pinned until T matches fully while the clock is before T."""

    @initialize(page=st.sampled_from([1, 2]), budget=st.sampled_from([None, 8, 24]))
    def setup(self, page: int, budget: int | None) -> None:
        self.pool = KVPool(40, page)
        self.cache = RadixCache(self.pool, page)
        self.budget = budget
        self.now = 0.0
        self.pinned: list[tuple[np.ndarray, int, float]] = []  # key, pinned length, deadline
        self.locked: list[Any] = []

    @rule(key=keys)
    def put(self, key: list[int]) -> None:
        arr = self.cache.tree.truncate(np.asarray(key, dtype=np.int64))  # whole pages
        match = self.cache.match_prefix(arr)
        own = self.pool.alloc(len(arr) - match.matched_len)
        if own is None:
            return
        slots = np.concatenate([match.indices, own])
        already = self.cache.insert(arr, slots)
        self.pool.free(slots[match.matched_len : already])

    @rule(key=keys)
    def match(self, key: list[int]) -> None:
        self.cache.match_prefix(key)

    @rule(key=keys, ttl=st.sampled_from([1.0, 5.0]))
    def pin(self, key: list[int], ttl: float) -> None:
        length = self.cache.pin(key, self.now + ttl, budget=self.budget)
        cached = self.cache.match_prefix(key, count_hit=False).matched_len
        assert length == cached if self.budget is None else length <= cached
        if self.budget is not None:
            assert self.cache.pinned_size <= self.budget
        if length:
            self.pinned.append((np.asarray(key[:length]), length, self.now + ttl))

    @rule(key=keys)
    def lock(self, key: list[int]) -> None:
        node = self.cache.match_prefix(key).last_node
        self.cache.lock(node)
        self.locked.append(node)

    @rule()
    def unlock(self) -> None:
        if self.locked:
            self.cache.unlock(self.locked.pop())

    @rule(n=st.integers(1, 40))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule(dt=st.sampled_from([0.5, 2.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.cache.unpin_expired(self.now)
        self.pinned = [p for p in self.pinned if p[2] > self.now]

    @invariant()
    def pins_hold(self) -> None:
        if not hasattr(self, "cache"):
            return
        check_invariants(self.pool, self.cache, idle=not self.locked)
        for key, length, _ in self.pinned:
            walk = self.cache.tree.walk(key, None)  # no split, no hit: only a look
            assert walk.pos + walk.partial_len >= length


TestPins = PinMachine.TestCase
TestPins.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
