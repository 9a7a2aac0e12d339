"""The overlap scheduler against the plain one, over a deterministic numpy "model".

`KVHashRunner` stores each token in its KV slot and picks the next token from a hash of the
whole slot table (tokens and positions), so any slot-table, cache-hit, chunking or retraction
mistake changes the output. Its overlapping variant hands out placeholders and only answers
`result()` in launch order, and accepts a placeholder only from the step launched just before:
the scheduler must never read or feed a token it has not got. Random workloads (shared
prefixes, stop tokens, seeds, aborts, a small KV pool that forces retraction, page sizes 1 and
4, chunked prefill) must give the same tokens and finish reasons both ways, with the cache
invariants holding whenever the scheduler goes idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localradix.config import ServerArgs
from localradix.messages import GenerateRequest
from localradix.runner.base import ModelRunner
from localradix.sampling_params import SamplingParams
from localradix.sched.sched_config import SchedulerConfig
from localradix.sched.scheduler import Scheduler
from localradix.step import ForwardBatch, SampleOutput, SamplingBatch

VOCAB = 50
EOS = 1
CONTEXT = 96


class KVHashRunner(ModelRunner):
    """Next token = hash of the request's KV (token, position) pairs, nudged by the draw."""

    def __init__(self, kv_capacity: int) -> None:
        self.kv_capacity = kv_capacity
        self.kv = np.full(kv_capacity + 1, -1, dtype=np.int64)  # slot -> token written there
        self.steps = 0

    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        return SampleOutput(self._run(batch.input_ids, batch, sampling))

    def _run(self, ids: np.ndarray, batch: ForwardBatch, sampling: SamplingBatch) -> np.ndarray:
        assert (ids >= 0).all(), "an unresolved placeholder reached the model"
        self.kv[batch.out_slots] = ids
        tokens = np.empty(batch.num_reqs, dtype=np.int64)
        for i in range(batch.num_reqs):
            slots = batch.kv_indices[batch.kv_indptr[i] : batch.kv_indptr[i + 1]]
            seen = self.kv[slots]
            assert (seen >= 0).all(), "a request reads a slot nobody wrote"
            h = int(((seen + 7) * np.arange(1, len(seen) + 1)).sum() * 2654435761 % 1_000_003)
            if sampling.temperature[i] > 0:
                h += int(sampling.uniform[i] * 1000)
            tokens[i] = h % VOCAB
        self.steps += 1
        return tokens


@dataclass
class _Pending:
    owner: OverlappingHashRunner
    index: int
    placeholders: np.ndarray
    tokens: np.ndarray

    def result(self) -> SampleOutput:
        assert self.owner.read == self.index, "results must be read once, in launch order"
        self.owner.read += 1
        return SampleOutput(self.tokens)


class OverlappingHashRunner(KVHashRunner):
    """As `KVHashRunner`, but `launch` returns placeholders instead of tokens."""

    overlaps = True

    def __init__(self, kv_capacity: int) -> None:
        super().__init__(kv_capacity)
        self.launched = self.read = 0
        self.last: dict[int, int] = {}  # placeholder -> token, of the latest launch only
        self.max_unread = 0

    def launch(self, batch: ForwardBatch, sampling: SamplingBatch) -> _Pending:
        ids = np.array([self.last[t] if t < 0 else t for t in batch.input_ids], dtype=np.int64)
        tokens = self._run(ids, batch, sampling)
        first = -(1000 * (self.launched + 1))
        placeholders = first - np.arange(batch.num_reqs, dtype=np.int64)
        self.last = dict(zip(placeholders.tolist(), tokens.tolist()))
        self.launched += 1
        self.max_unread = max(self.max_unread, self.launched - self.read)
        return _Pending(self, self.launched - 1, placeholders, tokens)


def _scheduler(
    runner: ModelRunner, args: ServerArgs, clock: Callable[[], float] = time.monotonic
) -> Scheduler:
    return Scheduler(
        runner,
        SchedulerConfig.from_args(args),
        context_len=CONTEXT,
        eos_token_ids=(EOS,),
        decode=lambda ids: " ".join(map(str, ids)),
        vocab_size=VOCAB,
        clock=clock,
    )


@dataclass(frozen=True)
class Job:
    prompt: tuple[int, ...]
    params: SamplingParams
    arrive: int  # step at which it is added
    abort_at: int | None  # step at which it is aborted, if any


STEMS = (tuple(range(2, 30)), tuple(range(30, 2, -1)))


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    stem = STEMS[draw(st.integers(0, 1))][: draw(st.integers(0, 28))]
    tail = tuple(draw(st.lists(st.integers(2, VOCAB - 1), min_size=1, max_size=12)))
    greedy = draw(st.booleans())
    params = SamplingParams(
        temperature=0.0 if greedy else 0.8,
        seed=None if greedy else draw(st.integers(0, 99)),
        max_new_tokens=draw(st.integers(1, 30)),
        ignore_eos=draw(st.booleans()),
        stop_token_ids=tuple(draw(st.lists(st.integers(2, VOCAB - 1), max_size=2))),
        stop=("7 8",) if draw(st.booleans()) else (),
    )
    arrive = draw(st.integers(0, 12))
    abort_at = draw(st.none() | st.integers(arrive, arrive + 20))
    return Job(stem + tail, params, arrive, abort_at)


def _serve(runner: ModelRunner, args: ServerArgs, work: list[Job]) -> dict[str, tuple]:
    sched = _scheduler(runner, args)
    tokens: dict[str, list[int]] = {}
    ends: dict[str, tuple] = {}
    step = 0
    while step <= 12 + 20 or sched.has_work():
        for i, job in enumerate(work):
            if job.arrive == step:
                sched.add_request(GenerateRequest(str(i), job.prompt, job.params))
            if job.abort_at == step:
                sched.abort(str(i))
        for out in sched.step():
            tokens.setdefault(out.rid, []).extend(out.new_token_ids)
            if out.finished:
                ends[out.rid] = (out.finish_reason, out.matched_stop, out.error)
        if sched.idle:
            sched.check_invariants(idle=True)
        step += 1
        assert step < 5000, "the scheduler stopped making progress"
    sched.check_invariants(idle=True)
    assert sched.pool.available + sched.cache.evictable_size == sched.pool.total
    return {rid: (tuple(tokens.get(rid, ())), ends[rid]) for rid in ends}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    work=st.lists(jobs(), min_size=1, max_size=8),
    page=st.sampled_from([1, 4]),
    pool=st.sampled_from([160, 400]),
    chunk=st.sampled_from([0, 8]),
    radix=st.booleans(),
)
def test_overlap_gives_the_same_tokens_as_plain_steps(work, page, pool, chunk, radix):
    args = ServerArgs(
        page_size=page,
        max_total_tokens=pool,
        chunked_prefill_size=chunk,
        disable_radix_cache=not radix,
        max_running_requests=6,
        new_token_ratio=0.05,  # admit eagerly so the small pool has to retract
    )
    # Aborts land at a step number, and overlap shifts when tokens arrive by a step; compare
    # those runs by their surviving requests only.
    plain = _serve(KVHashRunner(pool), args, work)
    runner = OverlappingHashRunner(pool)
    overlapped = _serve(runner, args, work)
    aborted = {str(i) for i, j in enumerate(work) if j.abort_at is not None}
    keep = lambda d: {k: v for k, v in d.items() if k not in aborted}  # noqa: E731
    assert keep(overlapped) == keep(plain)
    assert set(overlapped) == set(plain) == {str(i) for i in range(len(work))}
    assert runner.read == runner.launched


def test_steps_really_overlap():
    """Decode step N+1 is launched before step N's tokens are read, and one step runs past
    a stop only when the stop was not known at launch."""
    runner = OverlappingHashRunner(1000)
    args = ServerArgs(max_total_tokens=1000)
    sched = _scheduler(runner, args)
    params = SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True)
    sched.add_request(GenerateRequest("a", (5, 6, 7), params))
    got: list[int] = []
    while sched.has_work():
        for out in sched.step():
            got.extend(out.new_token_ids)
    assert len(got) == 20
    assert runner.max_unread == 2  # launch N+1 happened while N was unread
    assert runner.launched == 20  # max_new_tokens is known at launch: no wasted step
    plain = KVHashRunner(1000)
    sched = _scheduler(plain, args)
    sched.add_request(GenerateRequest("a", (5, 6, 7), params))
    want: list[int] = []
    while sched.has_work():
        for out in sched.step():
            want.extend(out.new_token_ids)
    assert got == want


@pytest.mark.parametrize("overlap", [False, True])
def test_retraction_keeps_seeded_tokens(overlap):
    """A retracted sampled request re-runs and draws the same tokens (draw index, not step)."""
    cls = OverlappingHashRunner if overlap else KVHashRunner
    params = SamplingParams(temperature=1.0, seed=3, max_new_tokens=40, ignore_eos=True)
    prompts = [tuple(range(2 + i, 40 + i)) for i in range(4)]

    def run(pool: int) -> tuple[dict[str, list[int]], int]:
        args = ServerArgs(max_total_tokens=pool, new_token_ratio=0.05)
        sched = _scheduler(cls(pool), args)
        for i, p in enumerate(prompts):
            sched.add_request(GenerateRequest(str(i), p, params))
        tokens: dict[str, list[int]] = {}
        while sched.has_work():
            for out in sched.step():
                tokens.setdefault(out.rid, []).extend(out.new_token_ids)
        sched.check_invariants(idle=True)
        return tokens, sched.retractions

    roomy, none = run(2000)
    tight, retracted = run(200)
    assert none == 0 and retracted > 0
    assert tight == roomy
