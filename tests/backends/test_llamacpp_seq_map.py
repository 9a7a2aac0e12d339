"""SeqMap (the llamacpp backend's slots -> tagged cells map) against a model of llama.cpp's memory.

`FakeCells` behaves as llama.cpp's unified KV cache does for the calls the backend makes: cells
hold a position and a set of sequence ids, `seq_cp` adds an id, `seq_rm` removes one and frees
cells left with none, and a decode checks llama.cpp's batch rules (a sequence continues at its
max position + 1; its positions stay contiguous) and takes free cells. `CellsHashRunner` picks
each next token from a hash of what the request's sequence can attend to, read from the cells,
so a wrong attach, a lost cell or a stale tag changes the output. Random workloads through the
real scheduler (shared prefixes, aborts, retraction under a small pool, chunked prefill, and few
sequence ids, so ids must be reclaimed by evicting) must give the tokens of the slot-addressed
`KVHashRunner`, and whenever idle the fake's live cells must be exactly the pool's used slots.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localradix.backends.llamacpp.seq_map import SeqMap, _runs
from localradix.config import ServerArgs
from localradix.runner.base import ModelRunner
from localradix.step import ForwardBatch, SampleOutput, SamplingBatch

from .conftest import load_test_module

_overlap = load_test_module("sched/test_overlap_scheduler.py")
VOCAB, KVHashRunner, _serve, jobs = (
    _overlap.VOCAB,
    _overlap.KVHashRunner,
    _overlap._serve,
    _overlap.jobs,
)


class FakeCells:
    """llama.cpp's unified cell pool, reduced to positions, tokens and sequence-id sets."""

    def __init__(self, n_cells: int) -> None:
        self.pos = np.full(n_cells, -1, dtype=np.int64)
        self.token = np.full(n_cells, -1, dtype=np.int64)
        self.seqs: list[set[int]] = [set() for _ in range(n_cells)]

    @property
    def used(self) -> int:
        return sum(1 for s in self.seqs if s)

    def cells_of(self, seq: int) -> list[int]:
        return sorted((i for i, s in enumerate(self.seqs) if seq in s), key=lambda i: self.pos[i])

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        p1 = np.iinfo(np.int64).max if p1 < 0 else p1
        for i in self.cells_of(seq):
            if max(p0, 0) <= self.pos[i] < p1:
                self.seqs[i].discard(seq)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        assert src != dst
        for i in self.cells_of(src):
            if p0 <= self.pos[i] < p1:
                self.seqs[i].add(dst)

    def decode(self, seq: int, tokens: np.ndarray, positions: np.ndarray) -> None:
        mine = self.cells_of(seq)
        held = self.pos[mine]
        assert list(held) == list(range(len(held))), f"sequence {seq} has holes: {held}"
        assert positions[0] == len(held), "a sequence must continue at its max position + 1"
        free = [i for i, s in enumerate(self.seqs) if not s]
        assert len(free) >= len(tokens), "llama_decode would return 1: no free cell"
        for cell, tok, p in zip(free, tokens, positions):
            self.pos[cell], self.token[cell], self.seqs[cell] = p, tok, {seq}

    def context(self, seq: int) -> np.ndarray:
        """The tokens `seq` attends to, in position order."""
        return self.token[self.cells_of(seq)]


class CellsHashRunner(ModelRunner):
    """`KVHashRunner`'s model, but the KV lives in `FakeCells` reached through a `SeqMap`."""

    def __init__(self, kv_capacity: int, n_seq: int) -> None:
        self.kv_capacity = kv_capacity
        self.cells = FakeCells(kv_capacity + 8)  # llama.cpp pads its cell count up
        self.map = SeqMap(self.cells, kv_capacity + 1, n_seq, 128)

    def bind_kv(self, pool, evict) -> None:
        pool.add_free_listener(self.map.release)
        self.map.set_evictor(evict)

    def check_kv(self, pool) -> None:
        allocated = np.setdiff1d(np.arange(1, pool.num_slots), pool.free_slots())
        self.map.check(allocated)
        assert self.cells.used == len(allocated), "llama.cpp's cells != the pool's used slots"

    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        out = np.empty(batch.num_reqs, dtype=np.int64)
        for i in range(batch.num_reqs):
            table = batch.kv_indices[batch.kv_indptr[i] : batch.kv_indptr[i + 1]]
            new = slice(batch.qo_indptr[i], batch.qo_indptr[i + 1])
            prefix = int(batch.prefix_lens[i])
            seq = self.map.sequence_for(int(batch.req_rows[i]), table, prefix)
            self.cells.decode(seq, batch.input_ids[new], batch.positions[new])
            self.map.written(seq, batch.positions[new], batch.out_slots[new])
            seen = self.cells.context(seq)
            h = int(((seen + 7) * np.arange(1, len(seen) + 1)).sum() * 2654435761 % 1_000_003)
            if sampling.temperature[i] > 0:
                h += int(sampling.uniform[i] * 1000)
            out[i] = h % VOCAB
        return SampleOutput(out)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    work=st.lists(jobs(), min_size=1, max_size=10),
    pool=st.sampled_from([160, 400]),
    chunk=st.sampled_from([0, 8]),
    n_seq=st.sampled_from([16, 256]),
    mixed=st.booleans(),
)
def test_tagged_cells_give_the_slot_runner_tokens(work, pool, chunk, n_seq, mixed):
    """Also: mixing decodes into prefill steps changes no token (the hash model is batch
    invariant), only the step a token comes in; aborts land at a step number, so with mixing
    the aborted requests are left out of the comparison."""
    args = ServerArgs(
        max_total_tokens=pool,
        chunked_prefill_size=chunk,
        max_running_requests=6,
        new_token_ratio=0.05,  # admit eagerly so the small pool has to retract
        mixed_prefill="off",
    )
    expected = _serve(KVHashRunner(pool), args, work)
    runner = CellsHashRunner(pool, n_seq)
    got = _serve(runner, args.replace(mixed_prefill="on" if mixed else "off"), work)
    aborted = {str(i) for i, j in enumerate(work) if mixed and j.abort_at is not None}
    assert set(got) == set(expected)
    assert {k: v for k, v in got.items() if k not in aborted} == {
        k: v for k, v in expected.items() if k not in aborted
    }
    assert runner.map.ids_in_use <= n_seq


def _fresh(n_seq: int = 8) -> tuple[FakeCells, SeqMap]:
    cells = FakeCells(64)
    return cells, SeqMap(cells, 65, n_seq, 32)


def _decoded(cells: FakeCells, seqs: SeqMap, row: int, slots: np.ndarray) -> int:
    seq = seqs.sequence_for(row, slots, 0)
    n = len(slots)
    cells.decode(seq, np.arange(n) + 100 * row, np.arange(n))
    seqs.written(seq, np.arange(n), slots)
    return seq


def test_a_shared_prefix_is_tagged_not_recomputed():
    cells, seqs = _fresh()
    first = _decoded(cells, seqs, 0, np.arange(1, 11))
    # Row 1 starts on the first 8 cached slots and computes 2 of its own.
    table = np.concatenate([np.arange(1, 9), [20, 21]])
    second = seqs.sequence_for(1, table, 8)
    assert second != first and cells.used == 10
    assert cells.cells_of(second) == cells.cells_of(first)[:8]
    # The pool frees the first request's last 2 slots: their cells go, the shared 8 stay.
    seqs.release(np.array([9, 10]))
    assert cells.used == 8
    seqs.check(np.arange(1, 9))


def test_a_reused_row_leaves_its_cached_cells_to_a_ghost():
    cells, seqs = _fresh()
    seq = _decoded(cells, seqs, 0, np.arange(1, 6))
    # The request left (its 5 slots went to the radix tree); a new one takes the same row.
    fresh = seqs.sequence_for(0, np.array([1, 2, 30]), 2)
    assert fresh != seq and cells.used == 5  # the old sequence still holds the cached cells
    assert seqs.row_of[seq] == -1
    seqs.release(np.arange(1, 6))  # the tree evicts them all
    assert cells.used == 0 and seqs.ids_in_use == 1  # the ghost's id came back


def test_out_of_ids_evicts_cached_leaves():
    cells, seqs = _fresh(n_seq=2)
    evicted = []

    def evict(n: int) -> int:
        evicted.append(n)
        seqs.release(np.arange(1, 4))
        return 3

    seqs.set_evictor(evict)
    _decoded(cells, seqs, 0, np.arange(1, 4))
    seqs.sequence_for(0, np.array([9]), 0)  # the row moves on; `a` becomes a ghost
    seqs.sequence_for(1, np.array([10]), 0)  # no id is free until the ghost's cells go
    assert evicted and cells.used == 0


@pytest.mark.parametrize(
    "positions, runs",
    [([], []), ([3], [(3, 4)]), ([1, 2, 3, 7, 8], [(1, 4), (7, 9)])],
)
def test_runs(positions, runs):
    assert _runs(np.array(positions, dtype=np.int64)) == runs


def test_a_row_of_the_same_length_on_other_cells_is_not_taken_as_continuing():
    cells, seqs = _fresh()
    old = _decoded(cells, seqs, 0, np.arange(1, 6))
    other = _decoded(cells, seqs, 1, np.arange(6, 11))
    # Row 0 now runs a request whose 5 cached tokens are row 1's cells.
    seq = seqs.sequence_for(0, np.arange(6, 12), 5)
    assert cells.cells_of(seq) == cells.cells_of(other)
    assert seq != old and cells.used == 10


def test_redundant_ghosts_go_before_any_eviction():
    cells, seqs = _fresh(n_seq=3)
    seqs.set_evictor(lambda n: pytest.fail("evicted while a redundant ghost could go"))
    first = _decoded(cells, seqs, 0, np.arange(1, 4))
    seqs.sequence_for(0, np.array([20]), 0)  # row 0 moves on: `first` holds the cells alone
    assert seqs.row_of[first] == -1
    seqs.sequence_for(1, np.array([1, 2, 3, 9]), 3)  # row 1 attaches: the ghost is redundant
    seqs.sequence_for(2, np.array([21]), 0)  # needs an id: the ghost goes, nothing is evicted
    assert seqs.row_of[first] == 2 and cells.used == 3
