"""Eviction: order under each policy, locked paths never evicted, cascading up, alloc pressure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from localradix.mem import POLICIES, get_policy

MemFactory = Callable[..., Any]  # conftest.Mem
A, B, C = (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3)


def evict_order(m: Any, n: int = 3) -> list[tuple[int, ...]]:
    """Evict one leaf at a time and report which key disappeared."""
    order = []
    for _ in range(n):
        before = m.keys()
        assert m.cache.evict(1) == 4
        m.check(idle=True)
        (gone,) = before - m.keys()
        order.append(gone)
    return order


def test_registry_has_the_four_policies() -> None:
    assert set(POLICIES) == {"lru", "lfu", "fifo", "priority"}
    assert get_policy("lfu").name == "lfu"


def test_lru_evicts_least_recently_used(mem: MemFactory) -> None:
    m = mem(32, policy="lru")
    for key in (A, B, C):
        m.put(key)
    m.cache.match_prefix(A)
    assert evict_order(m) == [B, C, A]


def test_lfu_evicts_least_hit(mem: MemFactory) -> None:
    m = mem(32, policy="lfu")
    for key in (A, B, C):
        m.put(key)
    for key, hits in ((A, 3), (B, 1), (C, 2)):
        for _ in range(hits):
            m.cache.match_prefix(key)
    assert evict_order(m) == [B, C, A]


def test_lfu_breaks_ties_by_recency(mem: MemFactory) -> None:
    m = mem(32, policy="lfu")
    for key in (A, B, C):
        m.put(key)
    for key in (C, B, A, C):
        m.cache.match_prefix(key)
    assert evict_order(m) == [B, A, C]


def test_fifo_evicts_oldest_whatever_its_use(mem: MemFactory) -> None:
    m = mem(32, policy="fifo")
    for key in (A, B, C):
        m.put(key)
    for _ in range(5):
        m.cache.match_prefix(A)
    assert evict_order(m) == [A, B, C]


def test_fifo_keeps_creation_time_across_splits(mem: MemFactory) -> None:
    m = mem(32, policy="fifo")
    m.put(A)
    m.put(B)
    m.put(A[:2] + (9, 9))  # splits A; the upper half keeps A's creation time
    lower = m.cache.match_prefix(A).last_node
    assert lower.parent.creation_time == lower.creation_time
    assert m.cache.evict(1) == 2  # A's lower half is the oldest leaf
    assert m.keys() == {(1, 1, 9, 9), B}
    assert m.cache.evict(1) == 4  # then B, older than the (9, 9) branch
    assert m.keys() == {(1, 1, 9, 9)}


def test_priority_evicts_lowest_priority_then_lru(mem: MemFactory) -> None:
    m = mem(32, policy="priority")
    m.put(A, priority=5)
    m.put(B, priority=1)
    m.put(C, priority=1)
    m.cache.match_prefix(B)
    assert evict_order(m) == [C, B, A]


def test_priority_of_a_shared_prefix_is_the_highest_user(mem: MemFactory) -> None:
    m = mem(32, policy="priority")
    m.put((7, 7, 7, 7, 1, 1, 1, 1), priority=9)
    m.put((7, 7, 7, 7, 2, 2, 2, 2), priority=0)
    shared = m.cache.match_prefix((7, 7, 7, 7)).last_node
    assert shared.priority == 9
    assert m.cache.match_prefix((7, 7, 7, 7, 2, 2, 2, 2)).last_node.priority == 0


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_locked_paths_are_never_evicted(mem: MemFactory, policy: str) -> None:
    m = mem(64, policy=policy)
    for key in (A, B, C, A[:2] + (5, 5)):
        m.put(key)
    held = m.cache.match_prefix(A).last_node
    m.cache.lock(held)
    freed = m.cache.evict(100)
    assert freed == 10  # B, C and the (5, 5) branch; A's path stays
    assert m.keys() == {A}
    assert m.cache.match_prefix(A).matched_len == 4
    assert m.cache.evict(1) == 0
    m.check()
    m.cache.unlock(held)
    assert m.cache.evict(3) == 4  # A was split by the (5, 5) branch: two nodes go
    assert m.cache.total_size == 0
    m.check(idle=True)


def test_eviction_cascades_up_as_parents_become_leaves(mem: MemFactory) -> None:
    m = mem(32)
    m.put((1, 2, 3))
    m.put((1, 2, 4))
    assert m.cache.evict(3) == 4
    assert m.cache.total_size == 0 and m.pool.available == 32
    m.check(idle=True)


def test_evict_stops_once_enough_is_freed(mem: MemFactory) -> None:
    m = mem(32)
    for key in (A, B, C):
        m.put(key)
    assert m.cache.evict(5) == 8
    assert m.cache.total_size == 4
    assert m.cache.evict(0) == 0


def test_evict_frees_at_least_what_is_asked(mem: MemFactory) -> None:
    m = mem(32)
    for tok in range(6):
        m.put([tok])
    assert m.cache.evict(2) == 2
    assert m.cache.evict(3) == 3
    assert m.cache.total_size == 1


def test_alloc_evicts_from_the_tree_before_failing(mem: MemFactory) -> None:
    m = mem(12)
    for key in (A, B, C):
        m.put(key)
    assert m.pool.available == 0
    m.cache.match_prefix(A)
    slots = m.pool.alloc(5)
    assert slots is not None and len(slots) == 5
    assert m.keys() == {A}  # B then C went (LRU), 8 freed for 5 asked
    m.check(idle=True, owned=[slots])
    m.cache.lock(m.cache.match_prefix(A).last_node)
    assert m.pool.alloc(4) is None  # only the locked prefix is left: nothing is evicted
    assert m.keys() == {A}
    m.check(owned=[slots])
    assert m.pool.alloc(3) is not None


def test_alloc_does_not_evict_when_it_cannot_succeed(mem: MemFactory) -> None:
    m = mem(8)
    m.put(A)
    own = m.pool.alloc(4)
    assert own is not None
    assert m.pool.alloc(5) is None
    assert m.keys() == {A}
    m.check(idle=True, owned=[own])
    assert not np.isin(own, m.cache.match_prefix(A).indices).any()
