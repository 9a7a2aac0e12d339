"""cache_control pins in the scheduler: applied after the prefill, surviving a flood of other
prompts that evicts everything unpinned, dropped when due, kept within half the pool, and never
leaving a request stuck. On the deterministic hash model of the overlap tests."""

from __future__ import annotations

from localradix.config import ServerArgs
from localradix.messages import CachePin, GenerateRequest
from localradix.sampling_params import SamplingParams
from localradix.sched.scheduler import Scheduler

from .test_overlap_scheduler import KVHashRunner, OverlappingHashRunner, _scheduler

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True)
SYSTEM = tuple(range(2, 42))  # 40 tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pinning_scheduler(total: int, overlap: bool = False) -> tuple[Scheduler, Clock]:
    runner = OverlappingHashRunner(total) if overlap else KVHashRunner(total)
    clock = Clock()
    sched = _scheduler(runner, ServerArgs(max_total_tokens=total), clock)
    return sched, clock


def _run(sched: Scheduler, rid: str, prompt: tuple[int, ...], *pins: CachePin) -> int:
    """Run one request to its end; return its cached prompt tokens."""
    sched.add_request(GenerateRequest(rid, prompt, GREEDY, pins=pins))
    cached = -1
    while sched.has_work():
        for out in sched.step():
            cached = out.cached_tokens if out.finished else cached
    sched.check_invariants(idle=True)  # pins are no leaked locks
    return cached


def _flood(sched: Scheduler, n: int) -> None:
    for i in range(n):  # unrelated 40-token prompts, together far larger than the pool
        _run(sched, f"flood{i}", tuple((i + 3 * j) % 48 + 2 for j in range(40)))


def test_a_pinned_prefix_survives_a_flood_that_evicts_an_unpinned_one():
    for overlap in (False, True):
        sched, clock = _pinning_scheduler(160, overlap)
        other = tuple(range(48, 8, -1))  # as long as SYSTEM, not pinned
        _run(sched, "pinned", (*SYSTEM, 44, 45), CachePin(len(SYSTEM), ttl_s=300))
        _run(sched, "unpinned", (*other, 44, 45))
        assert sched.stats().kv_pinned == len(SYSTEM)
        _flood(sched, 12)
        assert _run(sched, "again", (*SYSTEM, 46, 47)) == len(SYSTEM)
        assert _run(sched, "other again", (*other, 46, 47)) < 10
        clock.now += 301  # past the deadline: swept at the next step
        _run(sched, "tick", (3,))
        assert sched.stats().kv_pinned == 0 and not sched.cache.pins
        _flood(sched, 12)
        assert _run(sched, "gone", (*SYSTEM, 46, 47)) < 10


def test_a_repeat_renews_the_pin():
    sched, clock = _pinning_scheduler(160)
    _run(sched, "a", (*SYSTEM, 44), CachePin(len(SYSTEM), ttl_s=300))
    clock.now += 200
    _run(sched, "b", (*SYSTEM, 45), CachePin(len(SYSTEM), ttl_s=300))
    assert len(sched.cache.pins) == 1
    clock.now += 200  # 400 s after the first pin, 200 after the renewal
    _flood(sched, 8)
    assert _run(sched, "c", (*SYSTEM, 46)) == len(SYSTEM)


def test_pins_hold_at_most_half_the_pool():
    sched, _ = _pinning_scheduler(100)
    _run(sched, "a", tuple(range(2, 42)) + (44,), CachePin(40, ttl_s=300))
    _run(sched, "b", tuple(range(50, 90)) + (44,), CachePin(40, ttl_s=300))  # 80 > 50: clipped
    assert sched.stats().kv_pinned <= 50
    assert sched.cache.match_prefix(tuple(range(2, 42))).matched_len == 40


def test_a_request_larger_than_what_pins_leave_still_runs():
    sched, _ = _pinning_scheduler(100)
    _run(sched, "a", tuple(range(2, 50)), CachePin(48, ttl_s=3600))
    assert sched.stats().kv_pinned == 48
    long = SamplingParams(temperature=0.0, max_new_tokens=30, ignore_eos=True)
    sched.add_request(GenerateRequest("big", tuple(range(49, 9, -1)), long))  # 40 + 30 > 100 - 48
    outs = []
    while sched.has_work():
        outs += [o for o in sched.step() if o.finished]
    [out] = outs
    assert out.finish_reason == "length" and out.completion_tokens == 30
    assert not sched.cache.pins  # dropped for it
    sched.check_invariants(idle=True)


def test_pins_give_way_before_the_last_running_request_is_cut_short():
    sched, _ = _pinning_scheduler(100)
    _run(sched, "a", tuple(range(2, 50)), CachePin(48, ttl_s=3600))
    long = SamplingParams(temperature=0.0, max_new_tokens=60, ignore_eos=True)
    sched.add_request(GenerateRequest("big", tuple(range(49, 41, -1)), long))  # 8 + 60 > 52
    outs = []
    while sched.has_work():
        outs += [o for o in sched.step() if o.finished]
        if sched.queues.running:
            assert sched.retractions == 0
    [out] = outs
    assert out.finish_reason == "length" and out.completion_tokens == 60
    assert not sched.cache.pins
    sched.check_invariants(idle=True)


def test_a_flush_drops_pins():
    sched, _ = _pinning_scheduler(160)
    _run(sched, "a", (*SYSTEM, 44), CachePin(len(SYSTEM), ttl_s=300))
    sched.cache.reset()
    sched.check_invariants(idle=True)
    assert sched.stats().kv_pinned == 0 and sched.cache.total_size == 0


def test_pins_stay_within_the_cached_token_budget():
    sched = _scheduler(KVHashRunner(200), ServerArgs(max_total_tokens=200, max_cached_tokens=30))
    assert sched.pins.budget == 30
    _run(sched, "a", (*SYSTEM, 44), CachePin(len(SYSTEM), ttl_s=300))
    assert 0 < sched.stats().kv_pinned <= 30
