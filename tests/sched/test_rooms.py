"""The scheduler's rooms on their own, without the loop: prefill admission, decode with
retraction, the stop check and the cache-hit counters.

Admission and decode run on a real pool, tree and request table (and the deterministic hash
runner of the overlap tests for launches), and must keep every slot accounted for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from localradix.config import ServerArgs
from localradix.mem import KVPool, RadixCache, ReqToTokenPool, check_invariants
from localradix.sampling_params import SamplingParams
from localradix.sched.admission import PrefillAdmission
from localradix.sched.decode import (
    MIN_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY_STEPS,
    DecodePlanner,
)
from localradix.sched.launch import StepLauncher
from localradix.sched.queues import RequestQueues
from localradix.sched.request import Req, ReqState
from localradix.sched.sched_config import SchedulerConfig
from localradix.sched.slot_handoff import SlotHandoff
from localradix.sched.stats import CacheHits, SchedulerStats
from localradix.sched.stop_check import StopChecker

from .test_overlap_scheduler import KVHashRunner

CONTEXT = 64
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True)


@dataclass
class Rooms:
    args: ServerArgs
    queues: RequestQueues
    slots: SlotHandoff
    stats: SchedulerStats
    admission: PrefillAdmission
    decoding: DecodePlanner
    launcher: StepLauncher

    def check(self, extra: Sequence[Req] = ()) -> None:
        """Every slot in one place: the pool, the tree, or a request (reserved tail included)."""
        owned = [self._reserved(r) for r in self.queues.holders() + list(extra)]
        check_invariants(self.slots.pool, self.slots.cache, owned=owned)

    def _reserved(self, req: Req) -> np.ndarray:
        assert req.hold.row is not None
        end = self.slots.round_up(req.hold.kv_len + req.hold.extend_len)
        return self.slots.req_pool.table[req.hold.row, req.hold.cached_len : end]

    def run(self, batch: list[Req]) -> None:
        """Launch `batch` on the hash runner and apply its tokens."""
        self.launcher.read(self.launcher.launch(batch))


def rooms(pool_size: int, page: int = 1, chunk: int = 0, max_prefill: int = 8192) -> Rooms:
    args = ServerArgs(
        page_size=page,
        max_total_tokens=pool_size,
        chunked_prefill_size=chunk,
        max_prefill_tokens=max_prefill,
        max_running_requests=8,
        schedule_policy="fcfs",
        new_token_ratio=0.5,
    )
    pool = KVPool(pool_size, page_size=page)
    cache = RadixCache(pool, page_size=page)
    slots = SlotHandoff(pool, ReqToTokenPool(10, CONTEXT + 2 * page), cache)
    queues = RequestQueues()
    stats = SchedulerStats(queues, slots, lambda ids: " ".join(map(str, ids)), 1)
    stop = StopChecker((), CONTEXT, stats.decode)
    return Rooms(
        args,
        queues,
        slots,
        stats,
        PrefillAdmission(SchedulerConfig.from_args(args), queues, slots, stats),
        DecodePlanner(SchedulerConfig.from_args(args), queues, slots, stats, CONTEXT),
        StepLauncher(KVHashRunner(pool_size), queues, slots, stop, stats, 50),
    )


def req(rid: str, prompt: list[int], params: SamplingParams = GREEDY) -> Req:
    return Req.of(rid=rid, prompt_ids=np.asarray(prompt, dtype=np.int64), params=params)


STEM = list(range(2, 30))
prompts = st.lists(
    st.builds(
        lambda n, tail: STEM[:n] + tail,
        st.integers(0, 28),
        st.lists(st.integers(2, 49), min_size=1, max_size=12),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    work=prompts,
    cached=st.integers(0, 28),
    page=st.sampled_from([1, 4]),
    chunk=st.sampled_from([0, 8]),
    max_prefill=st.sampled_from([16, 8192]),
)
def test_admission_reserves_exactly_what_it_schedules(work, cached, page, chunk, max_prefill):
    r = rooms(200, page, chunk, max_prefill)
    if cached:  # an earlier request left part of the stem in the tree
        first = req("earlier", STEM[:cached] + [1])
        r.queues.waiting.append(first)
        while first.hold.state != ReqState.DECODE:  # its prefill, chunk by chunk
            r.run(r.admission.admit(0.0))
        r.slots.release(first)
        r.queues.running.clear()
    waiting = [req(str(i), p) for i, p in enumerate(work)]
    r.queues.waiting = list(waiting)
    hits_before = r.stats.hits.hit_tokens
    admitted = r.admission.admit(0.0)
    r.check(extra=[a for a in admitted if a is not r.queues.chunked])
    assert r.queues.waiting == [w for w in waiting if w not in admitted]  # order kept
    assert admitted and admitted[0] is waiting[0]  # fcfs, nothing running: the head fits
    assert sum(a.hold.extend_len for a in admitted) <= max_prefill
    for a in admitted:
        n = len(a.ask.prompt_ids)
        assert a.hold.state == ReqState.PREFILL and a.hold.extend_len > 0
        assert (
            a.hold.kv_len == a.hold.cached_len == a.hold.cached_tokens and a.hold.kv_len % page == 0
        )
        assert a.hold.kv_len + a.hold.extend_len <= n and a.hold.kv_len < n  # >= 1 token computed
        assert a.hold.last_node.lock_ref > 0 or a.hold.cached_len == 0
        cached_slots = r.slots.cache.match_prefix(a.ask.prompt_ids).indices[: a.hold.cached_len]
        assert (r.slots.req_pool.table[a.hold.row, : a.hold.cached_len] == cached_slots).all()
    partial = [a for a in admitted if a.hold.kv_len + a.hold.extend_len < len(a.ask.prompt_ids)]
    event(f"chunked: {bool(partial)}, hit: {any(a.hold.cached_len for a in admitted)}")
    assert partial == ([r.queues.chunked] if r.queues.chunked else [])
    assert r.stats.hits.hit_tokens == hits_before + sum(a.hold.cached_tokens for a in admitted)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(work=prompts, page=st.sampled_from([1, 4]), pool_size=st.sampled_from([80, 120]))
def test_decode_retracts_the_fewest_generated_first_and_keeps_every_slot(work, page, pool_size):
    r = rooms(pool_size, page)
    r.queues.waiting = [req(str(i), p[:30]) for i, p in enumerate(work)]
    for _ in range(1000):
        if not (r.queues.waiting or r.queues.running or r.queues.chunked):
            break
        batch = r.admission.admit(r.decoding.new_token_ratio)
        if not batch:
            before = list(r.queues.running)
            batch = r.decoding.plan()
            gone = [x for x in before if x not in r.queues.running and not x.finished]
            for victim in gone:  # retracted: back at the queue's head, without KV
                assert victim in r.queues.waiting[: len(gone)] and victim.hold.row is None
                assert victim.hold.state == ReqState.WAITING and victim.progress.pending == 0
                kept = [len(x.progress.output_ids) for x in r.queues.running]
                assert len(victim.progress.output_ids) <= min(
                    kept, default=len(victim.progress.output_ids)
                )
            if gone:  # the ratio went back up (then decayed by one step if a batch ran)
                initial = r.args.new_token_ratio
                step = (initial - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS
                assert r.decoding.new_token_ratio == (initial - step if batch else initial)
            assert r.slots.pool.available >= 0
        if batch:
            r.run(batch)
        r.check()
    assert not (r.queues.waiting or r.queues.running), "decode made no progress"
    check_invariants(r.slots.pool, r.slots.cache, idle=True)
    assert r.stats.retractions == sum(x.progress.retractions for x in r.queues.touched.values())
    event(f"retracted: {r.stats.retractions > 0}")


def test_a_lone_request_that_outgrows_the_pool_stops_with_length():
    r = rooms(12)
    long = req("a", [5, 6, 7], SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True))
    r.queues.waiting.append(long)
    for _ in range(40):
        batch = r.admission.admit(0.0) or r.decoding.plan()
        if not batch:
            break
        r.run(batch)
    assert long.outcome.finish_reason == "length" and len(long.progress.output_ids) < 40
    assert r.stats.retractions == 0 and long.hold.row is None
    check_invariants(r.slots.pool, r.slots.cache, idle=True)


def _stopped(params: SamplingParams, outputs: list[int], eos: tuple[int, ...] = (1,)) -> Req:
    checker = StopChecker(
        eos, context_len=100, decode=lambda ids: "".join(chr(96 + t) for t in ids)
    )
    r = req("s", [2, 3], params)
    for t in outputs:
        r.progress.output_ids.append(t)
        checker.check(r, t)
        if r.finished:
            break
    return r


def test_stop_check_order_and_reasons():
    p = SamplingParams(max_new_tokens=5, stop_token_ids=(9,))
    assert (
        _stopped(p, [4, 9]).outcome.finish_reason,
        _stopped(p, [4, 9]).outcome.matched_stop,
    ) == ("stop", 9)
    assert _stopped(p, [4, 1]).outcome.matched_stop == 1  # EOS
    assert _stopped(p.replace(ignore_eos=True), [1, 1, 1, 1, 1]).outcome.finish_reason == "length"
    assert _stopped(p, [4, 4, 4, 4, 4, 4]).progress.output_ids == [4] * 5  # max_new_tokens
    # a stop string found in the decoded tail, across tokens ("b" "c" "d" -> "bcd")
    s = _stopped(SamplingParams(max_new_tokens=9, stop=("cd", "zz")), [2, 3, 4, 5])
    assert (s.outcome.finish_reason, s.outcome.matched_stop, len(s.progress.output_ids)) == (
        "stop",
        "cd",
        3,
    )
    assert not _stopped(SamplingParams(max_new_tokens=9, stop=("ca",)), [3, 2, 4]).finished


def test_stop_check_ends_at_the_context_length():
    checker = StopChecker((), context_len=4, decode=lambda ids: "")
    r = req("s", [2, 3, 4], SamplingParams(max_new_tokens=9))
    r.progress.output_ids.append(5)
    checker.check(r, 5)
    assert r.outcome.finish_reason == "length"


def test_hit_counters() -> None:
    hits = CacheHits()
    assert hits.rate == 0.0
    hits.record(30, 10)
    hits.record(0, 40)
    assert (hits.hit_tokens, hits.miss_tokens) == (30, 50)
    assert hits.rate == pytest.approx(30 / 80)
