"""Slot accounting for the KV cache: a free list of token slots (or pages) and a request table.

The pools only account; the runner owns the KV tensors, indexed by slot. Invariants:
- slot 0 (all of page 0 when `page_size > 1`) is a dummy that is never handed out, so padded
  positions can point at it; usable slots are `page_size .. num_slots - 1`, and every slot id
  is `<= size`, so KV buffers of `size + 1` slots always suffice;
- every usable page is, at every moment, in exactly one place: the free list, the radix tree, or
  one request (docs/architecture.md, "Slot ownership"). Freeing a page twice, or one this pool never handed out, raises
  `SlotError`: that is a bug, never a runtime condition. Lack of space is a `None` result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Evictor = Callable[[int], int]  # evict(n_tokens) -> tokens freed back to this pool
FreeListener = Callable[[np.ndarray], None]  # told the slots of every free, as they are freed


class SlotError(ValueError):
    """A slot was freed twice, was never allocated, or is not a whole page."""


class KVPool:
    """Token-slot allocator over pages of `page_size` slots; page 0 is the dummy.

    `alloc` evicts from the radix tree (through `set_evictor`) before it reports `None`.
    """

    def __init__(self, size: int, page_size: int = 1) -> None:
        if page_size < 1 or size < 0:
            raise ValueError(f"need size >= 0 and page_size >= 1, got {size}, {page_size}")
        self.page_size = page_size
        # Usable pages are 1..num_pages, all inside slots 0..size; with page_size > 1 the dummy
        # costs a whole page, so `total` may be less than `size`.
        self.num_pages = max((size + 1) // page_size - 1, 0)
        # A stack whose top is the end, filled so the first allocations get the lowest ids.
        self._free = np.arange(self.num_pages, 0, -1, dtype=np.int64)
        self._n_free = self.num_pages
        self._is_free = np.ones(self.num_pages + 1, dtype=bool)
        self._is_free[0] = False
        self._evict: Evictor | None = None
        self._evictable: Callable[[], int] | None = None
        self._listeners: list[FreeListener] = []

    @property
    def total(self) -> int:
        """Usable slots (the dummy page excluded)."""
        return self.num_pages * self.page_size

    @property
    def available(self) -> int:
        """Free slots right now."""
        return self._n_free * self.page_size

    @property
    def num_slots(self) -> int:
        """Slots the KV buffers need, dummy page included: slot ids are < this (<= size + 1)."""
        return (self.num_pages + 1) * self.page_size

    def set_evictor(self, evict: Evictor, evictable: Callable[[], int] | None = None) -> None:
        """Register the cache's `evict`; with `evictable`, hopeless allocations evict nothing."""
        self._evict, self._evictable = evict, evictable

    def add_free_listener(self, listener: FreeListener) -> None:
        """Call `listener(slots)` on every free: a runner whose KV is not addressed by slot
        (llama.cpp's tagged cells) releases the matching cells at the same moment."""
        self._listeners.append(listener)

    def can_alloc(self, n: int) -> bool:
        """Whether `alloc(n)` would succeed, counting what the evictor says it could free."""
        if n <= self.available:
            return True
        if self._evict is None or n > self.total:
            return False
        return self._evictable is None or n <= self.available + self._evictable()

    def alloc(self, n: int) -> np.ndarray | None:
        """`n` free slots (int64), evicting first if short; `None` if they cannot fit.

        With `page_size > 1`, `n` must be a whole number of pages (see `alloc_pages`).
        """
        if n % self.page_size:
            raise ValueError(f"alloc({n}) is not a multiple of page_size {self.page_size}")
        pages = self.alloc_pages(n // self.page_size)
        return None if pages is None else self.pages_to_slots(pages)

    def alloc_pages(self, n_pages: int) -> np.ndarray | None:
        """`n_pages` free page ids (int64), evicting first if short; `None` if they cannot fit."""
        if n_pages < 0:
            raise ValueError(f"cannot allocate {n_pages} pages")
        if not self._ensure_free(n_pages):
            return None
        pages = self._free[self._n_free - n_pages : self._n_free][::-1].copy()  # ascending
        self._n_free -= n_pages
        self._is_free[pages] = False
        return pages

    def free(self, slots: np.ndarray) -> None:
        """Return slots to the free list; with `page_size > 1` they must form whole pages."""
        slots = np.asarray(slots, dtype=np.int64).ravel()
        if slots.size:
            self.free_pages(self._slots_to_pages(slots))

    def free_pages(self, pages: np.ndarray) -> None:
        """Return pages to the free list; raises `SlotError` on a double or foreign free."""
        pages = np.asarray(pages, dtype=np.int64).ravel()
        if not pages.size:
            return
        self._check_freeable(pages)
        self._free[self._n_free : self._n_free + pages.size] = pages
        self._n_free += pages.size
        self._is_free[pages] = True
        for listener in self._listeners:
            listener(self.pages_to_slots(pages))

    def free_slots(self) -> np.ndarray:
        """A copy of every free slot (for invariant checks and debugging)."""
        return self.pages_to_slots(self._free[: self._n_free])

    def pages_to_slots(self, pages: np.ndarray) -> np.ndarray:
        if self.page_size == 1:
            return pages.copy()
        offsets = np.arange(self.page_size, dtype=np.int64)
        return (pages[:, None] * self.page_size + offsets).ravel()

    def _ensure_free(self, n_pages: int) -> bool:
        short = (n_pages - self._n_free) * self.page_size
        if short <= 0:
            return True
        if self._evict is None or not self.can_alloc(n_pages * self.page_size):
            return False
        self._evict(short)
        return self._n_free >= n_pages

    def _slots_to_pages(self, slots: np.ndarray) -> np.ndarray:
        p = self.page_size
        if p == 1:
            return slots
        rows = slots.reshape(-1, p) if slots.size % p == 0 else None
        if rows is None or (rows[:, 0] % p).any() or (rows - rows[:, :1] != np.arange(p)).any():
            raise SlotError(f"free() needs whole, aligned pages of {p} slots; got {slots[:8]}...")
        return rows[:, 0] // p

    def _check_freeable(self, pages: np.ndarray) -> None:
        if pages.min() < 1 or pages.max() > self.num_pages:
            bad = pages[(pages < 1) | (pages > self.num_pages)]
            raise SlotError(f"freeing pages this pool never handed out: {bad[:8]}")
        if self._is_free[pages].any():
            raise SlotError(f"double free of pages {pages[self._is_free[pages]][:8]}")
        ordered = np.sort(pages)  # np.unique is far slower for this on numpy 2
        if (ordered[1:] == ordered[:-1]).any():
            raise SlotError("the same page appears twice in one free() call")


class ReqToTokenPool:
    """Request → slot table: row `r` lists the KV slots of a running request, token by token.

    Rows are 0-filled when freed, so a stale read points at the dummy slot, never at live KV.
    """

    def __init__(self, max_reqs: int, max_context_len: int) -> None:
        self.table = np.zeros((max_reqs, max_context_len), dtype=np.int64)
        self._free_rows = list(range(max_reqs - 1, -1, -1))
        self._is_free = np.ones(max_reqs, dtype=bool)

    @property
    def available(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        """A free row, or `None` if every row is in use."""
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self._is_free[row] = False
        return row

    def free(self, row: int) -> None:
        if not 0 <= row < len(self._is_free) or self._is_free[row]:
            raise SlotError(f"freeing request row {row}, which is not allocated")
        self.table[row] = 0
        self._is_free[row] = True
        self._free_rows.append(row)
