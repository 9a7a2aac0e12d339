"""Rejected drafts' KV through the real pool, radix cache and llama.cpp cell map.

A small engine-like driver runs requests through verify steps (k drafts, the first `a`
right): each step reserves and writes k + 1 positions, then frees `rejected_slots`. After
every step a request's slots hold exactly its real tokens, llama.cpp's sequence (a model of
its cells behind the real `SeqMap`, page size 1) attends to exactly them, and the memory
invariants hold with the requests' own slots counted; after the last request leaves the
engine is idle-clean and the tree holds no rejected draft token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from localradix.backends.llamacpp.seq_map import SeqMap
from localradix.mem import KVPool, RadixCache, ReqToTokenPool, check_invariants
from localradix.spec import kept_kv_len, rejected_slots

WRONG = 1000  # rejected drafts are tokens >= WRONG; real tokens are < 100
STEMS = ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9, 9], [40, 41, 42])


class FakeCells:
    """llama.cpp's unified cells: a position, a token and a set of sequence ids each."""

    def __init__(self, n: int) -> None:
        self.pos = np.full(n, -1, dtype=np.int64)
        self.token = np.full(n, -1, dtype=np.int64)
        self.seqs: list[set[int]] = [set() for _ in range(n)]

    def cells_of(self, seq: int) -> list[int]:
        return sorted((i for i, s in enumerate(self.seqs) if seq in s), key=lambda i: self.pos[i])

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        p1 = np.iinfo(np.int64).max if p1 < 0 else p1
        for i in self.cells_of(seq):
            if max(p0, 0) <= self.pos[i] < p1:
                self.seqs[i].discard(seq)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        for i in self.cells_of(src):
            if p0 <= self.pos[i] < p1:
                self.seqs[i].add(dst)

    def decode(self, seq: int, tokens: np.ndarray, positions: np.ndarray) -> None:
        held = self.pos[self.cells_of(seq)]
        assert list(held) == list(range(len(held))), f"sequence {seq} has holes: {held}"
        assert positions[0] == len(held), "a sequence continues at its max position + 1"
        free = [i for i, s in enumerate(self.seqs) if not s]
        for cell, tok, p in zip(free, tokens, positions):
            self.pos[cell], self.token[cell], self.seqs[cell] = p, tok, {seq}

    def context(self, seq: int) -> list[int]:
        return self.token[self.cells_of(seq)].tolist()


@dataclass
class Req:
    ids: list[int]  # prompt + verified outputs; the last one has no KV yet
    steps: list[tuple[int, int]]  # (k drafts, a accepted) per verify step
    row: int = -1
    node: object = None
    cached: int = 0
    kv_len: int = 0
    reserved: int = 0  # slots mapped in the row (whole pages)
    done: bool = field(default=False)


class Engine:
    def __init__(self, page: int) -> None:
        self.page = page
        self.pool = KVPool(400, page)
        self.cache = RadixCache(self.pool, page)
        self.rows = ReqToTokenPool(8, 512)
        self.slot_token = np.full(self.pool.num_slots, -1, dtype=np.int64)
        self.cells: FakeCells | None = None
        if page == 1:  # llama.cpp's page size
            self.cells = FakeCells(self.pool.num_slots)
            self.seqs = SeqMap(self.cells, self.pool.num_slots, 8, 512)
            self.pool.add_free_listener(self.seqs.release)
            self.seqs.set_evictor(self.cache.evict)

    def up(self, n: int) -> int:
        return -(-n // self.page) * self.page

    def start(self, req: Req) -> None:
        """Admit and prefill: the prompt's KV, then its first token (the next input)."""
        prompt = np.array(req.ids)
        match = self.cache.match_prefix(prompt)
        cached = min(match.matched_len, len(prompt) - 1) // self.page * self.page
        req.row = self.rows.alloc()
        self.cache.lock(match.last_node)
        req.node, req.cached, req.kv_len = match.last_node, cached, cached
        req.reserved = cached
        self.rows.table[req.row, :cached] = match.indices[:cached]
        self.write(req, req.ids[cached:])
        req.kv_len = len(req.ids)
        req.ids.append(next_token(req.ids))

    def verify_step(self, req: Req) -> None:
        k, a = req.steps.pop(0)
        truth = []
        for _ in range(k + 1):
            truth.append(next_token(req.ids + truth))
        drafts = truth[:a] + [WRONG + i for i in range(k - a)]
        written = req.kv_len + 1 + k
        self.write(req, [req.ids[-1]] + drafts)
        kept = kept_kv_len(req.kv_len, a)
        self.pool.free(rejected_slots(self.rows.table[req.row], kept, written, self.page))
        req.reserved = self.up(kept)
        req.kv_len = kept
        req.ids += truth[: a + 1]  # the accepted drafts and the correction/bonus token

    def write(self, req: Req, tokens: list[int]) -> None:
        """Reserve whole pages and compute KV for `tokens` at positions kv_len..."""
        start, end = req.kv_len, req.kv_len + len(tokens)
        if end > req.reserved:
            slots = self.pool.alloc(self.up(end - req.reserved))
            assert slots is not None
            self.rows.table[req.row, req.reserved : req.reserved + len(slots)] = slots
            req.reserved += len(slots)
        slots = self.rows.table[req.row, start:end]
        self.slot_token[slots] = tokens
        if self.cells is not None:
            table = self.rows.table[req.row, :end]
            seq = self.seqs.sequence_for(req.row, table, start)
            positions = np.arange(start, end)
            self.cells.decode(seq, np.array(tokens), positions)
            self.seqs.written(seq, positions, slots)

    def finish(self, req: Req) -> None:
        """What `Scheduler._release` does: cache whole pages of real tokens, free the rest."""
        slots = self.rows.table[req.row, : req.reserved].copy()
        whole = req.kv_len // self.page * self.page
        already = self.cache.insert(req.ids[:whole], slots[:whole])
        self.pool.free(slots[req.cached : already])
        self.pool.free(slots[whole:])
        self.cache.unlock(req.node)
        self.rows.free(req.row)
        req.done = True

    def check(self, live: list[Req]) -> None:
        for req in live:
            slots = self.rows.table[req.row, : req.kv_len]
            assert self.slot_token[slots].tolist() == req.ids[: req.kv_len]
            if self.cells is not None:
                seq = self.seqs.seq_of_row[req.row]
                assert self.cells.context(seq) == req.ids[: req.kv_len]
        owned = [self.rows.table[r.row, r.cached : r.reserved] for r in live]
        check_invariants(self.pool, self.cache, idle=not live, owned=owned)
        if self.cells is not None:
            used = np.setdiff1d(np.arange(1, self.pool.num_slots), self.pool.free_slots())
            self.seqs.check(used)


def next_token(ids: list[int]) -> int:
    """The 'model': a deterministic next token of the last three."""
    return (ids[-1] * 7 + ids[-2] * 3 + ids[-3] + 1) % 97 if len(ids) >= 3 else 5


requests = st.builds(
    lambda stem, extra, steps: Req(list(STEMS[stem]) + extra, steps),
    st.integers(0, 2),
    st.lists(st.integers(0, 99), max_size=3),
    st.lists(
        st.integers(0, 6).flatmap(lambda k: st.tuples(st.just(k), st.integers(0, k))), max_size=6
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(requests, min_size=1, max_size=4), st.sampled_from([1, 4]))
def test_rejected_drafts_leave_no_kv_and_never_reach_the_tree(reqs: list[Req], page: int):
    engine = Engine(page)
    live: list[Req] = []
    for req in reqs:  # requests arrive one step apart, so later ones hit earlier ones' cache
        engine.start(req)
        live.append(req)
        engine.check(live)
        for other in list(live):
            if other.steps:
                engine.verify_step(other)
            else:
                engine.finish(other)
                live.remove(other)
            engine.check(live)
    while live:
        for other in list(live):
            if other.steps:
                engine.verify_step(other)
            else:
                engine.finish(other)
                live.remove(other)
            engine.check(live)
    for node in engine.cache.iter_nodes():
        assert (node.key < WRONG).all(), "a rejected draft reached the radix tree"


def test_rejected_slots_by_page():
    row = np.arange(100, 116)
    assert rejected_slots(row, 5, 9).tolist() == [105, 106, 107, 108]
    assert rejected_slots(row, 5, 9, page_size=4).tolist() == [108, 109, 110, 111]
    assert rejected_slots(row, 8, 9, page_size=4).tolist() == [108, 109, 110, 111]
    assert rejected_slots(row, 9, 9, page_size=4).size == 0
    assert kept_kv_len(10, 3) == 14
