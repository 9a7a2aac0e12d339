"""SeqMap: the pool's KV slots laid onto llama.cpp's unified cell pool, shared by tagging.

llama.cpp addresses KV by (sequence id, position), not by slot: a cell holds one position and a
set of sequence ids, `seq_cp` adds an id to cells (no data copy) and `seq_rm` removes one; a
cell with no id left is free. localradix's pool and radix tree address KV by slot. This map keeps
the two in step, so that one slot is always exactly one live cell:
- every running request (a row of the request table) decodes into its own sequence id, which
  holds the request's whole path: cached prefix cells (tagged in with `seq_cp`, never
  recomputed) and the cells it computed itself;
- cells the radix tree owns stay alive because some sequence still tags them: the sequence
  that computed them, which keeps its tags after its request leaves ("ghost" sequences), or
  any request that attached to them;
- when the pool frees a slot (eviction, a duplicate, an abort), every sequence tagging that
  cell drops it, so llama.cpp frees the cell at the same moment;
- sequence ids are scarce (256): a ghost whose every cell has another tag is dropped, and when
  none is, the radix cache is asked to evict its least recently used leaf.
Invariant (checked by `check`): the live cells are exactly the slots written and not freed,
each tagged at least once, and every id in use holds a cell or a row.
A cell's sequences agree on the cells before it (its root path), because a sequence only
ever takes cells from a sequence holding the same path; so one matching last cell and no
holes prove that a row's sequence holds a whole prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import numpy as np

from localradix.mem.kv_tiers import KVUnavailable

Evictor = Callable[[int], int]  # evict(n_tokens) -> tokens freed
T = TypeVar("T")


class SeqMemory(Protocol):
    """The two llama.cpp memory calls the map needs (positions [p0, p1))."""

    def seq_rm(self, seq: int, p0: int, p1: int) -> None: ...

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...


class SeqIdsExhausted(RuntimeError):
    """No sequence id could be freed: more rows than llama.cpp has sequences."""


class SeqMap:
    def __init__(self, memory: SeqMemory, num_slots: int, n_seq: int, max_len: int) -> None:
        self.memory = memory
        self.n_seq = n_seq
        self.tags = np.zeros((num_slots, n_seq), dtype=bool)  # slot x sequence
        self.ntags = np.zeros(num_slots, dtype=np.int32)
        self.slot_pos = np.full(num_slots, -1, dtype=np.int32)  # -1: no live cell
        self.paths = np.full((n_seq, max_len), -1, dtype=np.int32)  # sequence x position
        self.count = np.zeros(n_seq, dtype=np.int64)  # live cells per sequence
        self.top = np.zeros(n_seq, dtype=np.int64)  # highest position + 1
        self.row_of = np.full(n_seq, -1, dtype=np.int64)  # -1: a ghost (or free)
        self.seq_of_row: dict[int, int] = {}
        self._free_ids = list(range(n_seq - 1, -1, -1))
        self._evict: Evictor | None = None

    def set_evictor(self, evict: Evictor) -> None:
        self._evict = evict

    # ---- what the runner calls ------------------------------------------------------------

    def sequence_for(self, row: int, table: np.ndarray, prefix_len: int) -> int:
        """The sequence of request row `row`, holding exactly `table[:prefix_len]`."""
        seq = self.seq_of_row.get(row)
        if seq is not None and self._continues(seq, table, prefix_len):
            return seq
        if seq is not None and not self._trim(seq, table, prefix_len):
            self._unbind(seq)  # it keeps cells only it holds: it stays on as a ghost
            seq = None
        if seq is None:
            seq = self._new_seq()
            self.row_of[seq], self.seq_of_row[row] = row, seq
        self._fill(seq, table, prefix_len)
        return seq

    def written(self, seq: int, positions: np.ndarray, slots: np.ndarray) -> None:
        """Record cells llama.cpp just computed for `seq` at `positions` as `slots`."""
        self._tag(seq, positions, slots)

    def release(self, slots: np.ndarray) -> None:
        """The pool freed `slots`: every sequence drops their cells (llama.cpp frees them)."""
        slots = np.asarray(slots, dtype=np.int64)
        slots = slots[self.slot_pos[slots] >= 0]  # reserved but never written: no cell
        if not slots.size:
            return
        which, seqs = np.nonzero(self.tags[slots])
        for seq in np.unique(seqs):
            mine = slots[which[seqs == seq]]
            self._untag(int(seq), np.sort(self.slot_pos[mine]))
        self.slot_pos[slots] = -1

    def export(self, slots: np.ndarray, scratch: int, save: Callable[[int], T]) -> T:
        """`save(scratch)` with `scratch` (an id outside the map) tagged onto exactly the
        cells of `slots`, which lie on one cached path; `scratch` is emptied after."""
        positions = self.slot_pos[slots]
        if (positions < 0).any():
            raise KVUnavailable("exporting slots that hold no cell")
        deepest = int(slots[np.argmax(positions)])
        holders = [s for s in np.flatnonzero(self.tags[deepest]) if self.tags[slots, s].all()]
        if not holders:
            raise KVUnavailable("no llama.cpp sequence holds all of the exported cells")
        holder = int(holders[0])
        for start, end in _runs(np.sort(positions)):
            self.memory.seq_cp(holder, scratch, start, end)
        try:
            return save(scratch)
        finally:
            self.memory.seq_rm(scratch, -1, -1)

    def adopt(
        self, prefix: np.ndarray, slots: np.ndarray, scratch: int, load: Callable[[int], None]
    ) -> None:
        """New cells for `slots` at the positions after the cached path `prefix`: `load(scratch)`
        puts them into llama.cpp as `scratch`'s only cells; a new ghost sequence then holds the
        whole path (prefix tagged in, the new cells moved over), as if it had computed it."""
        seq = self._new_seq()  # may evict (the caller keeps `prefix` locked): before `load`
        n, end = len(prefix), len(prefix) + len(slots)
        self._fill(seq, prefix, n)
        try:
            load(scratch)
            self.memory.seq_cp(scratch, seq, n, end)
        finally:
            self.memory.seq_rm(scratch, -1, -1)
        self._tag(seq, np.arange(n, end), np.asarray(slots, dtype=np.int64))
        if self.count[seq] == 0:  # nothing at all (an empty load): give the id back
            self._free_ids.append(seq)

    @property
    def live_cells(self) -> int:
        return int((self.slot_pos >= 0).sum())

    @property
    def ids_in_use(self) -> int:
        return self.n_seq - len(self._free_ids)

    def check(self, allocated: np.ndarray | None = None) -> None:
        """The map's invariants; with `allocated`, live cells are exactly those slots."""
        live = np.flatnonzero(self.slot_pos >= 0)
        assert (self.ntags[live] >= 1).all(), "a live cell no sequence tags"
        assert (self.ntags == self.tags.sum(axis=1)).all(), "tag counts drifted"
        assert not self.tags[self.slot_pos < 0].any(), "a dead cell still tagged"
        used = np.setdiff1d(np.arange(self.n_seq), self._free_ids)
        for seq in used:
            path = self.paths[seq, : self.top[seq]]
            held = path[path >= 0]
            assert len(held) == self.count[seq], f"sequence {seq} count drifted"
            assert self.count[seq] or self.row_of[seq] >= 0, f"sequence {seq} leaked"
            assert self.tags[held, seq].all(), f"sequence {seq} path and tags disagree"
        if allocated is not None:
            assert np.array_equal(live, np.sort(allocated)), "live cells != allocated slots"

    # ---- continuing, trimming, filling a row's sequence -----------------------------------

    def _continues(self, seq: int, table: np.ndarray, n: int) -> bool:
        top = int(self.top[seq])
        return (
            top == n and self.count[seq] == n and (n == 0 or self.paths[seq, n - 1] == table[n - 1])
        )

    def _trim(self, seq: int, table: np.ndarray, n: int) -> bool:
        """Drop the cells `seq` holds that are not `table[:n]`, if others hold them too."""
        path = self.paths[seq, : self.top[seq]]
        held = np.flatnonzero(path >= 0)
        inside = held < n
        matches = np.zeros(len(held), dtype=bool)
        matches[inside] = path[held[inside]] == table[held[inside]]
        wrong = held[~matches]
        if not wrong.size:
            return True
        if (self.ntags[path[wrong]] < 2).any():
            return False
        self._untag(seq, wrong)
        return True

    def _fill(self, seq: int, table: np.ndarray, n: int) -> None:
        """Tag `seq` onto the cells of `table[:n]` it lacks, from sequences holding them."""
        holes = np.flatnonzero(self.paths[seq, :n] < 0)
        for start, end in reversed(_runs(holes)):
            while end > start:
                src = self._holder(table[end - 1], exclude=seq)
                same = self.paths[src, start:end] == table[start:end]
                differ = np.flatnonzero(~same)
                begin = start + int(differ[-1]) + 1 if differ.size else start
                self.memory.seq_cp(src, seq, begin, end)
                self._tag(seq, np.arange(begin, end), table[begin:end])
                end = begin

    def _holder(self, slot: int, exclude: int) -> int:
        holders = np.flatnonzero(self.tags[slot])
        holders = holders[holders != exclude]
        if not holders.size:
            raise RuntimeError(f"slot {slot} is in a request's prefix but no sequence holds it")
        return int(holders[0])

    # ---- sequence ids ---------------------------------------------------------------------

    def _new_seq(self) -> int:
        if not self._free_ids:
            self._reclaim()
        return self._free_ids.pop()

    def _reclaim(self) -> None:
        """Free a sequence id: drop redundant ghosts, else evict cached leaves until one goes."""
        self._drop_redundant_ghosts()
        while not self._free_ids:
            if self._evict is None or self._evict(1) == 0:
                raise SeqIdsExhausted(
                    f"all {self.n_seq} llama.cpp sequence ids are in use by running requests; "
                    "lower --max-running-requests"
                )
            self._drop_redundant_ghosts()

    def _drop_redundant_ghosts(self) -> None:
        for seq in np.flatnonzero((self.row_of < 0) & (self.count > 0)):
            path = self.paths[seq, : self.top[seq]]
            if (self.ntags[path[path >= 0]] >= 2).all():
                self.memory.seq_rm(int(seq), -1, -1)
                self._forget(int(seq), np.flatnonzero(path >= 0))

    def _unbind(self, seq: int) -> None:
        del self.seq_of_row[int(self.row_of[seq])]
        self.row_of[seq] = -1
        if self.count[seq] == 0:
            self._free_ids.append(seq)

    # ---- the mirror -------------------------------------------------------------------------

    def _tag(self, seq: int, positions: np.ndarray, slots: np.ndarray) -> None:
        self.paths[seq, positions] = slots
        self.tags[slots, seq] = True
        self.ntags[slots] += 1
        self.slot_pos[slots] = positions
        self.count[seq] += len(slots)
        if len(positions):
            self.top[seq] = max(int(self.top[seq]), int(positions.max()) + 1)

    def _untag(self, seq: int, positions: np.ndarray) -> None:
        """Remove `seq` from its cells at (sorted) `positions`, in llama.cpp and here."""
        for start, end in _runs(positions):
            self.memory.seq_rm(seq, int(start), int(end))
        self._forget(seq, positions)

    def _forget(self, seq: int, positions: np.ndarray) -> None:
        slots = self.paths[seq, positions]
        self.tags[slots, seq] = False
        self.ntags[slots] -= 1
        self.paths[seq, positions] = -1
        self.count[seq] -= len(positions)
        held = np.flatnonzero(self.paths[seq, : self.top[seq]] >= 0)
        self.top[seq] = int(held[-1]) + 1 if held.size else 0
        if self.count[seq] == 0 and self.row_of[seq] < 0:
            self._free_ids.append(seq)


def _runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """Sorted positions as half-open runs of consecutive values."""
    if not len(positions):
        return []
    cuts = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(positions)]])
    return [(int(positions[s]), int(positions[e - 1]) + 1) for s, e in zip(starts, ends)]
