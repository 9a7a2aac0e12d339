"""RadixCache unit tests: match, insert, splits at every boundary, pages, namespaces, locks."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from localradix.mem import KVPool, RadixCache

MemFactory = Callable[..., Any]  # conftest.Mem
KEY = list(range(100, 108))


def test_empty_cache_matches_nothing(mem: MemFactory) -> None:
    m = mem(16)
    match = m.cache.match_prefix([1, 2, 3])
    assert match.matched_len == 0 and match.indices.size == 0
    assert match.last_node is m.cache.root
    assert match.divergence is not None
    assert (match.divergence.reason, match.divergence.position) == ("uncached", 0)
    assert m.cache.match_prefix([]).divergence is None


def test_insert_then_full_match(mem: MemFactory) -> None:
    m = mem(16)
    slots = m.pool.alloc(8)
    assert slots is not None
    assert m.cache.insert(np.array(KEY), slots) == 0
    match = m.cache.match_prefix(KEY)
    assert match.matched_len == 8 and match.divergence is None
    assert match.indices.tolist() == slots.tolist()
    assert m.cache.evictable_size == 8 and m.cache.protected_size == 0
    m.check(idle=True)


def test_insert_copies_the_callers_slots(mem: MemFactory) -> None:
    m = mem(16)
    slots = m.pool.alloc(8)
    assert slots is not None
    m.cache.insert(KEY, slots)
    kept = slots.tolist()
    slots[:] = 0
    assert m.cache.match_prefix(KEY).indices.tolist() == kept


def test_insert_returns_cached_length_and_keeps_tree_slots(mem: MemFactory) -> None:
    m = mem(32)
    first = m.pool.alloc(8)
    assert first is not None
    m.cache.insert(KEY, first)
    second = m.pool.alloc(10)
    assert second is not None
    already = m.cache.insert(KEY + [1, 2], second)
    assert already == 8
    m.pool.free(second[:already])  # the caller's duplicates
    m.check(idle=True)
    assert m.cache.match_prefix(KEY + [1, 2]).indices.tolist() == first.tolist() + [
        int(second[8]),
        int(second[9]),
    ]


@pytest.mark.parametrize("k", range(1, len(KEY)))
def test_match_splits_at_every_boundary(mem: MemFactory, k: int) -> None:
    m = mem(32)
    m.put(KEY)
    whole = m.cache.match_prefix(KEY).indices
    match = m.cache.match_prefix(KEY[:k] + [999])
    m.check(idle=True)
    assert match.matched_len == k
    assert len(match.last_node.key) == k
    assert match.indices.tolist() == whole[:k].tolist()
    div = match.divergence
    assert div is not None and div.reason == "mismatch"
    assert (div.position, div.request_token, div.cached_token) == (k, 999, KEY[k])
    assert div.node is not None and div.node.parent is match.last_node and div.node_offset == k
    assert m.put(KEY[:k] + [999]) == k
    assert m.cache.match_prefix(KEY).indices.tolist() == whole.tolist()
    assert m.cache.total_size == len(KEY) + 1


@pytest.mark.parametrize("k", range(1, len(KEY)))
def test_match_ending_inside_a_node_splits_it(mem: MemFactory, k: int) -> None:
    m = mem(32)
    m.put(KEY)
    match = m.cache.match_prefix(KEY[:k])
    assert match.matched_len == k and match.divergence is None
    assert len(match.last_node.key) == k and len(m.cache.root.children) == 1
    m.check(idle=True)


@pytest.mark.parametrize("k", range(1, len(KEY)))
def test_insert_diverging_at_every_boundary(mem: MemFactory, k: int) -> None:
    m = mem(32)
    m.put(KEY)
    other = KEY[:k] + [7, 7, 7]
    assert m.put(other) == k
    assert m.cache.match_prefix(other).matched_len == len(other)
    assert m.cache.match_prefix(KEY).matched_len == len(KEY)
    assert m.cache.total_size == len(KEY) + 3


def test_insert_ending_inside_a_node_does_not_split(mem: MemFactory) -> None:
    m = mem(32)
    m.put(KEY)
    slots = m.pool.alloc(3)
    assert slots is not None
    assert m.cache.insert(KEY[:3], slots) == 3
    m.pool.free(slots)
    assert len(list(m.cache.iter_nodes())) == 1
    m.check(idle=True)


def test_insert_needs_a_slot_per_token(mem: MemFactory) -> None:
    m = mem(8)
    with pytest.raises(ValueError, match="slots"):
        m.cache.insert(KEY, np.arange(1, 4))


def test_split_keeps_locks_on_the_whole_path(mem: MemFactory) -> None:
    m = mem(32)
    m.put(KEY)
    held = m.cache.match_prefix(KEY).last_node
    m.cache.lock(held)
    assert m.cache.protected_size == 8
    upper = m.cache.match_prefix(KEY[:3]).last_node
    assert upper.lock_ref == 1 and held.parent is upper and held.lock_ref == 1
    m.check()
    m.cache.unlock(held)
    assert upper.lock_ref == 0 and m.cache.evictable_size == 8
    m.check(idle=True)


def test_lock_unlock_moves_sizes_up_to_the_root(mem: MemFactory) -> None:
    m = mem(32)
    m.put(KEY)
    m.put(KEY[:4] + [1, 2])
    leaf = m.cache.match_prefix(KEY[:4] + [1, 2]).last_node
    m.cache.lock(leaf)
    m.cache.lock(leaf)
    assert (m.cache.evictable_size, m.cache.protected_size) == (4, 6)
    m.check()
    m.cache.unlock(leaf)
    assert m.cache.protected_size == 6
    m.cache.unlock(leaf)
    assert (m.cache.evictable_size, m.cache.protected_size) == (10, 0)
    with pytest.raises(RuntimeError, match="without a matching lock"):
        m.cache.unlock(leaf)
    m.check(idle=True)


def test_idle_check_catches_a_leaked_lock(mem: MemFactory) -> None:
    m = mem(16)
    m.put(KEY)
    m.cache.lock(m.cache.match_prefix(KEY).last_node)
    m.check()
    with pytest.raises(AssertionError, match="idle"):
        m.check(idle=True)


def test_root_lock_is_a_no_op(mem: MemFactory) -> None:
    m = mem(16)
    m.cache.lock(m.cache.root)
    m.cache.unlock(m.cache.root)
    m.check(idle=True)


def test_lock_on_an_evicted_node_raises(mem: MemFactory) -> None:
    m = mem(16)
    m.put(KEY)
    stale = m.cache.match_prefix(KEY).last_node
    assert m.cache.evict(8) == 8
    with pytest.raises(RuntimeError, match="evicted"):
        m.cache.lock(stale)
    m.check(idle=True)


@pytest.mark.parametrize("k", [16, 32, 48])
def test_page16_splits_at_every_page_boundary(mem: MemFactory, k: int) -> None:
    m = mem(256, page_size=16)
    key = list(range(64))
    m.put(key)
    other = key[:k] + [-1] * 16
    match = m.cache.match_prefix(other)
    assert match.matched_len == k and len(match.last_node.key) == k
    assert m.put(other) == k
    assert m.cache.total_size == 80
    m.check(idle=True)


def test_page16_mismatch_inside_a_page_matches_whole_pages_only(mem: MemFactory) -> None:
    m = mem(256, page_size=16)
    key = list(range(64))
    m.put(key)
    other = key[:37] + [-5] * 27
    match = m.cache.match_prefix(other)
    assert match.matched_len == 32
    div = match.divergence
    assert div is not None and div.reason == "mismatch"
    assert (div.position, div.request_token, div.cached_token) == (37, -5, 37)
    assert div.node_offset == 37
    assert m.put(other) == 32
    m.check(idle=True)


def test_page16_truncates_to_whole_pages(mem: MemFactory) -> None:
    m = mem(256, page_size=16)
    key = np.arange(40)
    slots = m.pool.alloc(48)
    assert slots is not None
    assert m.cache.insert(key, slots) == 0
    m.pool.free(slots[32:])  # the caller keeps and frees the partial tail page
    assert m.cache.total_size == 32
    match = m.cache.match_prefix(key)
    assert match.matched_len == 32 and match.indices.tolist() == slots[:32].tolist()
    div = match.divergence
    assert div is not None and (div.reason, div.position) == ("partial_page", 32)
    assert m.cache.match_prefix(key[:15]).matched_len == 0
    m.check(idle=True)


def test_page16_child_key_is_the_first_page(mem: MemFactory) -> None:
    m = mem(256, page_size=16)
    a = list(range(32))
    b = list(range(15)) + [-1] + list(range(16))  # same first token, different first page
    m.put(a)
    assert m.put(b) == 0
    assert len(m.cache.root.children) == 2
    m.check(idle=True)


def test_namespaces_never_share_nodes(mem: MemFactory) -> None:
    m = mem(64)
    m.put(KEY, extra_key="lora-a")
    assert m.cache.match_prefix(KEY).matched_len == 0
    assert m.cache.match_prefix(KEY, extra_key="lora-b").matched_len == 0
    assert m.cache.match_prefix(KEY, extra_key="lora-a").matched_len == 8
    assert m.put(KEY) == 0
    assert m.put(KEY, extra_key="lora-b") == 0
    assert m.cache.total_size == 24 and len(m.cache.root.children) == 3
    assert m.put(KEY[:4] + [5], extra_key="lora-a") == 4
    div = m.cache.match_prefix(KEY, extra_key="tenant-x").divergence
    assert div is not None and div.reason == "uncached"
    m.check(idle=True)


def test_divergence_names_the_most_recent_sibling(mem: MemFactory) -> None:
    m = mem(64)
    m.put([1, 2, 3, 4])
    m.put([1, 2, 5, 6])
    m.cache.match_prefix([1, 2, 3])
    div = m.cache.match_prefix([1, 2, 9, 9]).divergence
    assert div is not None and div.reason == "mismatch"
    assert (div.position, div.cached_token, div.request_token) == (2, 3, 9)
    assert div.as_dict()["cached_token"] == 3
    div = m.cache.match_prefix([1, 2, 3, 4, 8]).divergence
    assert div is not None and (div.reason, div.position, div.cached_token) == ("uncached", 4, None)


def test_match_stamps_hits_and_time_insert_does_not_count_hits(mem: MemFactory) -> None:
    m = mem(32)
    m.put(KEY)
    node = m.cache.match_prefix(KEY).last_node
    hits, t = node.hit_count, node.last_access_time
    m.cache.match_prefix(KEY)
    assert node.hit_count == hits + 1 and node.last_access_time > t
    m.put(KEY)
    assert node.hit_count == hits + 2  # put's own match counts, its insert does not


def test_disabled_cache_caches_nothing(mem: MemFactory) -> None:
    m = mem(16, disable=True)
    slots = m.pool.alloc(8)
    assert slots is not None
    assert m.cache.insert(KEY, slots) == 8
    m.pool.free(slots)
    match = m.cache.match_prefix(KEY)
    assert match.matched_len == 0 and match.last_node is m.cache.root
    assert match.divergence is not None and match.divergence.reason == "disabled"
    m.cache.lock(match.last_node)
    m.cache.unlock(match.last_node)
    assert m.cache.evict(8) == 0 and m.cache.total_size == 0
    m.check(idle=True)


def test_reset_frees_everything_unless_locked(mem: MemFactory) -> None:
    m = mem(32)
    m.put(KEY)
    m.put(KEY[:2] + [0, 0])
    node = m.cache.match_prefix(KEY).last_node
    m.cache.lock(node)
    with pytest.raises(RuntimeError, match="locked"):
        m.cache.reset()
    m.cache.unlock(node)
    m.cache.reset()
    assert m.pool.available == 32 and m.cache.total_size == 0
    assert m.cache.match_prefix(KEY).matched_len == 0
    m.check(idle=True)


def test_top_prefixes_rank_by_prefill_saved(mem: MemFactory) -> None:
    m = mem(64)
    m.put(KEY)  # KEY has 8 tokens
    m.put(KEY[:3] + [1, 2, 3, 4, 5, 6, 7, 8], extra_key="t")
    m.put([9, 9])
    m.put(KEY[:5] + [7, 7])  # splits KEY after 5 tokens
    for _ in range(3):
        m.cache.match_prefix(KEY[:5] + [42])  # three requests share the 5-token prefix
    leaf = m.cache.match_prefix(KEY).last_node
    m.cache.lock(leaf)
    top = m.cache.top_prefixes(2)
    # the shared 5-token node: 3 matches, KEY's match and the split's own match through it
    assert [(t["tokens"], t["hits"], t["leaf"]) for t in top] == [(5, 5, False), (8, 1, True)]
    assert top[0]["saved_tokens"] == 25 and top[0]["head"] == KEY[:5]
    assert top[1]["locked"] and top[0]["locked"]  # locking the leaf locks its path
    m.cache.unlock(leaf)
    everything = m.cache.top_prefixes(10)
    assert len(everything) == 5  # every node ends a prefix
    assert any(t["extra_key"] == "t" and t["tokens"] == 11 for t in everything)


def test_page_size_must_match_the_pool() -> None:
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(KVPool(32, 16), page_size=1)


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="lru"):
        RadixCache(KVPool(4), eviction_policy="random")


def test_cold_prefixes_are_evicted_alone_and_a_hit_warms_them(mem: MemFactory) -> None:
    m = mem(64)

    def put(key: list[int], cold_from: float) -> None:
        slots = m.pool.alloc(len(key))
        assert slots is not None
        m.cache.insert(np.array(key), slots, cold_from=cold_from)

    put(list(range(10, 18)), cold_from=math.inf)  # warm: e.g. a conversation's history
    put(list(range(20, 28)), cold_from=5.0)  # one-off prompts, cold from t = 5 and 6
    put(list(range(30, 38)), cold_from=6.0)
    assert m.cache.evictable_cold_size(4.0) == 0  # nothing is cold yet
    assert m.cache.evict(100, cold_at=4.0) == 0
    assert m.cache.evictable_cold_size(5.0) == 8
    assert m.cache.evictable_cold_size(6.0) == 16
    m.cache.match_prefix(list(range(30, 34)))  # a hit on half of one: that half is warm now
    assert m.cache.evictable_cold_size(6.0) == 12
    assert m.cache.evict(100, cold_at=6.0) == 12  # only cold leaves, never their warm parents
    assert m.cache.match_prefix(list(range(10, 18))).matched_len == 8
    assert m.cache.match_prefix(list(range(30, 38))).matched_len == 4
    assert m.cache.match_prefix(list(range(20, 28))).matched_len == 0
    m.check(idle=True)
