"""KVPool and ReqToTokenPool: allocation, the dummy slot, eviction before failure, misuse."""

from __future__ import annotations

import numpy as np
import pytest

from localradix.mem import KVPool, ReqToTokenPool, SlotError


def test_slot_zero_is_never_handed_out() -> None:
    pool = KVPool(8)
    slots = pool.alloc(8)
    assert slots is not None
    assert sorted(slots.tolist()) == list(range(1, 9))
    assert slots.dtype == np.int64
    assert pool.available == 0 and pool.total == 8 and pool.num_slots == 9


def test_alloc_and_free_round_trip() -> None:
    pool = KVPool(10)
    a, b = pool.alloc(3), pool.alloc(4)
    assert a is not None and b is not None
    assert not set(a.tolist()) & set(b.tolist())
    assert pool.available == 3
    pool.free(a)
    pool.free(b)
    assert pool.available == 10
    assert sorted(pool.free_slots().tolist()) == list(range(1, 11))


def test_alloc_zero_is_empty() -> None:
    pool = KVPool(4)
    slots = pool.alloc(0)
    assert slots is not None and slots.size == 0
    pool.free(np.zeros(0, np.int64))
    assert pool.available == 4


def test_cannot_fit_is_none_not_an_exception() -> None:
    pool = KVPool(4)
    assert pool.alloc(5) is None
    assert pool.alloc(4) is not None
    assert pool.alloc(1) is None
    assert pool.available == 0


@pytest.mark.parametrize("bad", [[0], [11], [-1]])
def test_free_of_dummy_or_foreign_slot_raises(bad: list[int]) -> None:
    pool = KVPool(10)
    pool.alloc(10)
    with pytest.raises(SlotError):
        pool.free(np.array(bad))


def test_double_free_raises_and_changes_nothing() -> None:
    pool = KVPool(10)
    slots = pool.alloc(3)
    assert slots is not None
    pool.free(slots[:1])
    with pytest.raises(SlotError, match="double free"):
        pool.free(slots)
    assert pool.available == 8
    with pytest.raises(SlotError, match="twice"):
        pool.free(np.array([slots[1], slots[1]]))
    assert pool.available == 8


def test_alloc_evicts_only_what_is_short() -> None:
    pool = KVPool(10)
    asked: list[int] = []
    held = pool.alloc(10)
    assert held is not None
    pool.free(held[8:])
    cached = held[:8]

    def evict(n: int) -> int:
        asked.append(n)
        pool.free(cached[:n])
        return n

    pool.set_evictor(evict)
    slots = pool.alloc(5)
    assert asked == [3]
    assert slots is not None and len(slots) == 5


def test_hopeless_alloc_evicts_nothing() -> None:
    pool = KVPool(10)
    assert pool.alloc(6) is not None
    calls: list[int] = []

    def evict(n: int) -> int:
        calls.append(n)
        return 0

    pool.set_evictor(evict, lambda: 2)
    assert not pool.can_alloc(7)
    assert pool.alloc(7) is None
    assert calls == []
    assert pool.can_alloc(6)
    assert pool.alloc(11) is None


def test_alloc_fails_if_eviction_falls_short() -> None:
    pool = KVPool(4)
    assert pool.alloc(4) is not None
    pool.set_evictor(lambda n: 0)
    assert pool.alloc(1) is None


def test_paged_pool_hands_out_whole_aligned_pages() -> None:
    pool = KVPool(50, page_size=16)  # slots 0..50 hold pages 0..2; page 0 is the dummy
    assert pool.total == 32 and pool.num_slots == 48
    slots = pool.alloc(32)
    assert slots is not None
    assert sorted(slots.tolist()) == list(range(16, 48))
    assert pool.alloc(16) is None
    pool.free(slots[16:])
    assert pool.available == 16


@pytest.mark.parametrize(("size", "page", "total"), [(10, 1, 10), (47, 16, 32), (46, 16, 16)])
def test_slot_ids_stay_within_size(size: int, page: int, total: int) -> None:
    pool = KVPool(size, page)
    slots = pool.alloc(pool.total)
    assert pool.total == total and slots is not None
    assert slots.max() <= size and pool.num_slots <= size + 1


def test_paged_pool_rejects_partial_pages() -> None:
    pool = KVPool(48, page_size=16)
    with pytest.raises(ValueError, match="multiple"):
        pool.alloc(10)
    slots = pool.alloc(32)
    assert slots is not None
    with pytest.raises(SlotError, match="whole"):
        pool.free(slots[:10])
    with pytest.raises(SlotError, match="whole"):
        pool.free(slots[1:17])
    pool.free(slots)


def test_alloc_pages_and_pages_to_slots() -> None:
    pool = KVPool(64, page_size=16)
    pages = pool.alloc_pages(2)
    assert pages is not None
    assert pages.tolist() == [1, 2]
    assert pool.pages_to_slots(pages).tolist() == list(range(16, 48))
    pool.free_pages(pages)
    with pytest.raises(SlotError):
        pool.free_pages(pages)


def test_req_to_token_pool_rows() -> None:
    rp = ReqToTokenPool(2, 8)
    assert rp.table.shape == (2, 8) and rp.table.dtype == np.int64
    a, b = rp.alloc(), rp.alloc()
    assert {a, b} == {0, 1} and rp.alloc() is None and rp.available == 0
    assert a is not None
    rp.table[a, :3] = [5, 6, 7]
    rp.free(a)
    assert not rp.table[a].any() and rp.available == 1
    with pytest.raises(SlotError):
        rp.free(a)
    with pytest.raises(SlotError):
        rp.free(7)
