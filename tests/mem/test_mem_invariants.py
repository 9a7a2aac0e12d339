"""check_invariants must catch each kind of corruption it promises to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

MemFactory = Callable[..., Any]  # conftest.Mem


@pytest.fixture
def m(mem: MemFactory) -> Any:
    m = mem(16)
    m.put([1, 2, 3, 4])
    m.put([1, 2, 5])
    return m


def test_clean_state_passes(m: Any) -> None:
    own = m.pool.alloc(3)
    m.check(idle=True, owned=[own])


def test_leaked_slot(m: Any) -> None:
    m.pool.alloc(2)
    with pytest.raises(AssertionError, match="leaked"):
        m.check()


def test_slot_owned_by_a_request_and_the_tree(m: Any) -> None:
    in_tree = m.cache.match_prefix([1, 2]).indices
    with pytest.raises(AssertionError, match="owned twice"):
        m.check(owned=[in_tree])


def test_slot_owned_by_two_requests(m: Any) -> None:
    own = m.pool.alloc(2)
    with pytest.raises(AssertionError, match="owned twice"):
        m.check(owned=[own, own[:1]])


def test_dummy_slot_in_use(m: Any) -> None:
    with pytest.raises(AssertionError, match="dummy"):
        m.check(owned=[np.array([0])])


def test_lock_count_out_of_step(m: Any) -> None:
    node = m.cache.match_prefix([1, 2, 3, 4]).last_node
    node.lock_ref = 1
    with pytest.raises(AssertionError, match="lock_ref"):
        m.check()


def test_size_counters_out_of_step(m: Any) -> None:
    m.cache.tree.evictable += 1
    with pytest.raises(AssertionError, match="evictable/protected"):
        m.check()


def test_stale_leaf_set(m: Any) -> None:
    m.cache.tree.leaves.clear()
    with pytest.raises(AssertionError, match="candidate"):
        m.check()


def test_pool_mask_and_list_disagree(m: Any) -> None:
    m.pool._is_free[1] = not m.pool._is_free[1]
    with pytest.raises(AssertionError, match="free mask"):
        m.check()


def test_node_detached_from_its_parent(m: Any) -> None:
    node = m.cache.match_prefix([1, 2, 3, 4]).last_node
    node.parent.children.clear()
    node.parent.children[-1] = node
    with pytest.raises(AssertionError, match="not its parent's child"):
        m.check()


def test_paged_request_may_own_a_partial_page(mem: MemFactory) -> None:
    m = mem(32, page_size=4)
    own = m.pool.alloc(8)
    m.check(owned=[own[:6]])  # the last page is half used, still owned by the request
    with pytest.raises(AssertionError, match="shared"):
        m.check(owned=[own[:6], own[7:]])
