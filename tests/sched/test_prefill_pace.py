"""A long prompt's prefill does not stall everyone else: its chunks are sized to a time budget
(PrefillPace, from the measured speed), requests that arrive meanwhile are admitted whole before
its next chunk, and (without --mixed-prefill) decode steps alternate with its chunks. Greedy
tokens are the same as when each request runs alone (deterministic hash model)."""

from __future__ import annotations

from localradix.config import ServerArgs
from localradix.messages import GenerateRequest
from localradix.sampling_params import SamplingParams
from localradix.sched.prefill_pace import FIRST_STEP_TOKENS, MIN_STEP_TOKENS, PrefillPace

from .test_overlap_scheduler import KVHashRunner, _scheduler

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
LONG = tuple(
    3 + i % 45 for i in range(80)
)  # 80 prompt tokens: the hash model has 50 ids, context 96


def test_the_pace_follows_the_measured_speed_within_its_bounds() -> None:
    pace = PrefillPace(budget_s=2.0, cap=2048, page=16)
    assert pace.step_tokens() == FIRST_STEP_TOKENS  # nothing measured yet: a probe
    pace.record(300, 1.7)  # ~5.7 ms a token: 353 tokens in 2 s, a page multiple
    assert pace.step_tokens() == 352
    pace.record(8, 100.0)  # too small a step to time tokens: ignored
    assert pace.step_tokens() == 352
    pace.record(100, 10.0)  # much slower now (attention grows): never below the minimum
    assert pace.step_tokens() == MIN_STEP_TOKENS
    for _ in range(20):
        pace.record(4000, 0.01)  # a GPU: the cap decides
    assert pace.step_tokens() == 2048
    assert PrefillPace(budget_s=0, cap=2048).step_tokens() == 2048  # budget off: fixed chunks
    assert PrefillPace(budget_s=0.5, cap=0).step_tokens() == 0  # never chunk


def _run(args: ServerArgs, arrivals: dict[int, list[GenerateRequest]]) -> dict:
    """Step the scheduler, adding `arrivals[step]` before that step; per request: its tokens
    and the steps at which it got tokens."""
    sched = _scheduler(KVHashRunner(4000), args)
    tokens: dict[str, list[int]] = {}
    at: dict[str, list[int]] = {}
    step = 0
    while sched.has_work() or any(s >= step for s in arrivals):
        for msg in arrivals.get(step, []):
            sched.add_request(msg)
        for out in sched.step():
            tokens.setdefault(out.rid, []).extend(out.new_token_ids)
            if out.new_token_ids:
                at.setdefault(out.rid, []).append(step)
        step += 1
    sched.check_invariants(idle=True)
    return {"tokens": tokens, "at": at, "steps": step}


def _args(**kw) -> ServerArgs:
    base = dict(max_total_tokens=4000, chunked_prefill_size=16, max_prefill_tokens=16)
    return ServerArgs(**{**base, "step_budget_ms": 0.0, "mixed_prefill": "off", **kw})


def test_a_short_request_arriving_mid_prefill_goes_first_and_gets_the_same_tokens() -> None:
    short = GenerateRequest("short", (7, 8, 9, 10), GREEDY)
    long = GenerateRequest("long", LONG, GREEDY)
    mixed = _run(_args(), {0: [long], 2: [short]})
    alone = _run(_args(), {0: [short]})
    assert mixed["tokens"]["short"] == alone["tokens"]["short"]
    assert mixed["tokens"]["long"] == _run(_args(), {0: [long]})["tokens"]["long"]
    # admitted in the step it arrived, beside the long prompt's chunk, not after all 5 chunks
    assert mixed["at"]["short"][0] == 2
    steps = mixed["at"]["short"]
    assert all(b - a <= 2 for a, b in zip(steps, steps[1:])), steps  # every other step at worst


def test_decode_steps_alternate_with_a_long_prompts_chunks() -> None:
    """Without --mixed-prefill a generating request got no step until the whole prompt was in;
    now it gets every other step."""
    first = GenerateRequest(
        "first", (5, 6, 7), SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    )
    long = GenerateRequest("long", LONG, GREEDY)
    run = _run(_args(), {0: [first], 1: [long]})
    steps = run["at"]["first"]
    assert len(run["tokens"]["first"]) == 12
    chunking = range(2, run["at"]["long"][0])  # the steps of the long prompt's chunks
    decoded = [s for s in steps if s in chunking]
    assert len(decoded) >= len(chunking) // 2 - 1, (steps, list(chunking))
    assert run["tokens"]["first"] == _run(_args(), {0: [first]})["tokens"]["first"]


def test_the_measured_pace_sizes_the_chunks() -> None:
    sched = _scheduler(
        KVHashRunner(4000),
        _args(chunked_prefill_size=256, max_prefill_tokens=8192, step_budget_ms=500.0),
    )
    sched.pace.min_tokens = 8  # the hash model's context is 96 tokens: a small minimum
    sched.pace.seconds_per_token = 0.01  # as if measured: 50 tokens fit in 0.5 s
    sched.add_request(GenerateRequest("long", LONG, GREEDY))
    sizes = []
    while sched.queues.waiting or sched.queues.chunked is not None or not sizes:
        batch = sched._schedule()
        sizes.append(sum(r.hold.extend_len for r in batch))
        sched.launcher.read(sched.launcher.launch(batch))
        sched.pace.seconds_per_token = 0.01  # keep it fixed against the real clock
    assert sizes[:-1] and all(n == 50 for n in sizes[:-1]), sizes


def test_a_stream_of_newcomers_never_stops_the_long_prompt() -> None:
    """Newcomers get a step of their own (the chunk sits it out), but never two in a row: with
    one arriving every step the long prompt still takes a chunk every other prefill step (every
    4th step here, with the decode steps between, instead of never)."""
    long = GenerateRequest("long", LONG, GREEDY)
    shorts = {s: [GenerateRequest(f"s{s}", (7, 8 + s % 30), GREEDY)] for s in range(1, 30)}
    run = _run(_args(), {0: [long], **shorts})
    chunks = -(-len(LONG) // 14)  # chunks of 14-16: the newcomers take a token or two
    assert run["at"]["long"][0] <= 4 * chunks, run["at"]["long"]
    assert all(run["at"][f"s{s}"][0] <= s + 1 for s in range(1, 30))  # each starts at once
