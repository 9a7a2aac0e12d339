"""Models with recurrent state under the radix cache: snapshots at branch points and ends.

`RecurrentRunner` is a toy recurrent model in numpy: each request's state folds in every
token it processed (a rolling hash), and the next token is read off the state alone, so a
request resumed from the wrong state, or from a snapshot at the wrong position, emits other
tokens. It checks on every step that a request's state has folded exactly `prefix_len` tokens.
The property test runs random workloads (shared system prompts, chats, aborts, a small KV pool
that evicts and retracts, a small snapshot budget) and wants the tokens of each request run
alone with the cache off; whenever the engine is idle the scheduler checks that the runner
holds exactly the snapshots the tree does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localradix.config import ServerArgs
from localradix.messages import GenerateRequest
from localradix.runner.base import ModelRunner
from localradix.sampling_params import SamplingParams
from localradix.sched.sched_config import SchedulerConfig
from localradix.sched.scheduler import Scheduler
from localradix.step import ForwardBatch, SampleOutput, SamplingBatch

from .test_overlap_scheduler import VOCAB, _scheduler

SNAPSHOT_BYTES = 16  # what the toy says each snapshot costs


@dataclass(frozen=True)
class State:
    folded: int  # tokens folded in
    value: int

    def fold(self, token: int) -> State:
        return State(self.folded + 1, (self.value * 1_000_003 + token + 7) % 2_147_483_647)


EMPTY = State(0, 1)


class RecurrentRunner(ModelRunner):
    """One recurrent state per request row; snapshots are saved States (StateSnapshots)."""

    def __init__(self, kv_capacity: int, snapshot_budget: int = 10 * SNAPSHOT_BYTES) -> None:
        self.kv_capacity = kv_capacity
        self.budget = snapshot_budget
        self.snapshots = self
        self.rows: dict[int, State] = {}
        self.pending: dict[int, State] = {}
        self.saved: dict[int, State] = {}
        self.next_handle = 0
        self.restores = 0
        self.forwards = 0

    # StateSnapshots
    def save(self, row: int) -> tuple[int, int]:
        self.next_handle += 1
        self.saved[self.next_handle] = self.rows[row]
        return self.next_handle, SNAPSHOT_BYTES

    def restore(self, row: int, handle: int | None) -> None:
        self.pending[row] = EMPTY if handle is None else self.saved[handle]
        self.restores += handle is not None

    def release(self, handle: int) -> None:
        del self.saved[handle]

    @property
    def live(self) -> int:
        return len(self.saved)

    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        assert batch.req_rows is not None
        self.forwards += 1
        tokens = np.empty(batch.num_reqs, dtype=np.int64)
        for i in range(batch.num_reqs):
            row = int(batch.req_rows[i])
            state = self.pending.pop(row) if row in self.pending else self.rows[row]
            assert state.folded == batch.prefix_lens[i], "resumed from the wrong position"
            for token in batch.input_ids[batch.qo_indptr[i] : batch.qo_indptr[i + 1]]:
                state = state.fold(int(token))
            self.rows[row] = state
            tokens[i] = 2 + state.value % (VOCAB - 2)
        return SampleOutput(tokens)


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)


def _run(sched, jobs: list[tuple[str, tuple[int, ...]]]) -> dict[str, list[int]]:
    for rid, prompt in jobs:
        sched.add_request(GenerateRequest(rid, prompt, GREEDY))
    got: dict[str, list[int]] = {}
    while sched.has_work():
        for out in sched.step():
            got.setdefault(out.rid, []).extend(out.new_token_ids)
    sched.check_invariants(idle=True)
    return got


def _long_scheduler(runner: RecurrentRunner, **kw: object) -> Scheduler:
    """A scheduler for prompts past the overlap tests' 96-token context."""
    args = ServerArgs(max_total_tokens=runner.kv_capacity, **kw)  # type: ignore[arg-type]
    return Scheduler(
        runner,
        SchedulerConfig.from_args(args),
        context_len=400,
        eos_token_ids=(1,),
        decode=str,
        vocab_size=VOCAB,
    )


def _alone(
    prompt: tuple[int, ...], params: SamplingParams = GREEDY, long: bool = False
) -> list[int]:
    runner = RecurrentRunner(1000 if long else 400)
    sched = (
        _long_scheduler(runner) if long else _scheduler(runner, ServerArgs(max_total_tokens=400))
    )
    sched.add_request(GenerateRequest("x", prompt, params))
    got: list[int] = []
    while sched.has_work():
        for out in sched.step():
            got.extend(out.new_token_ids)
    return got


SYSTEM = tuple(range(10, 40))


def test_the_second_request_on_a_prefix_snapshots_its_branch_point_for_the_third():
    runner = RecurrentRunner(400)
    sched = _scheduler(runner, ServerArgs(max_total_tokens=400))
    prompts = [SYSTEM + (41 + i, 42, 43) for i in range(4)]
    cached = []
    for i, prompt in enumerate(prompts):
        got = _run(sched, [(str(i), prompt)])
        assert got[str(i)] == _alone(prompt)
        cached.append(sched.stats().cache_hit_tokens)
    # 1st: nothing; 2nd: no snapshot inside the system prompt yet (it takes one at its end);
    # 3rd and 4th resume there.
    assert np.diff([0, *cached]).tolist() == [0, 0, len(SYSTEM), len(SYSTEM)]
    assert sched.stats().snapshot_hits == 2
    # the 2nd request found the system prompt in the tree but no snapshot in it
    assert sched.stats().snapshot_miss_tokens == len(SYSTEM)


def test_a_cold_prompt_leaves_snapshots_every_eighth_so_the_second_request_resumes_near():
    runner = RecurrentRunner(1000, snapshot_budget=100 * SNAPSHOT_BYTES)
    sched = _long_scheduler(runner)
    stem = tuple(2 + i % 47 for i in range(200))
    first, second = stem + (5,) * 20, stem + (6,) * 20
    assert _run(sched, [("a", first)])["a"] == _alone(first, long=True)
    store = sched.cache.snapshots
    assert store is not None
    # 220 tokens: a weak snapshot every 32 (the 1/8 stride's floor) up to 192; strong ones at
    # the prompt's end and the request's; a weak one at 224, 16 generated tokens being due
    assert store.count == 6 + 2 + 1 and len(store.weak) == 7
    assert _run(sched, [("b", second)])["b"] == _alone(second, long=True)
    assert sched.stats().cache_hit_tokens == 192  # the stride snapshot under the 200 shared


def test_with_the_cache_off_a_prompt_is_not_cut_for_snapshots():
    runner = RecurrentRunner(1000)
    sched = _long_scheduler(runner, disable_radix_cache=True)
    prompt = tuple(2 + i % 47 for i in range(220))
    assert _run(sched, [("a", prompt)])["a"] == _alone(prompt, long=True)
    assert runner.forwards == 1 + 5 and sched.cache.snapshots.count == 0  # prefill + 5 decodes


def test_a_chat_resumes_each_turn_where_the_last_one_ended():
    runner = RecurrentRunner(400)
    sched = _scheduler(runner, ServerArgs(max_total_tokens=400))
    prompt: tuple[int, ...] = SYSTEM
    for turn in range(5):
        before = sched.stats().cache_hit_tokens
        reply = _run(sched, [(f"t{turn}", prompt)])[f"t{turn}"]
        assert reply == _alone(prompt)
        # all of the last turn came from the cache, but its reply's last token (never
        # computed: sampled, then the request ended) and the 10 new tokens
        assert sched.stats().cache_hit_tokens - before == (len(prompt) - 11 if turn else 0)
        prompt = prompt + tuple(reply) + tuple(range(48 - turn, 38 - turn, -1))


def test_a_turn_whose_reply_tokenizes_otherwise_resumes_at_the_last_prompt_end():
    """A chat client sends the reply back as text, which may tokenize to other ids: the next
    turn still holds the previous prompt whole, and resumes where it ended."""
    runner = RecurrentRunner(400)
    sched = _scheduler(runner, ServerArgs(max_total_tokens=400))
    first = SYSTEM + (41, 42)
    reply = _run(sched, [("t0", first)])["t0"]
    retokenized = (reply[0], 3 if reply[1] != 3 else 4, *reply[2:])  # its 2nd id differs
    second = first + retokenized + (44, 45, 46)
    assert _run(sched, [("t1", second)])["t1"] == _alone(second)
    assert sched.stats().cache_hit_tokens == len(first)


def test_a_reply_that_tokenizes_otherwise_midway_resumes_at_the_last_decode_snapshot():
    runner = RecurrentRunner(400)
    sched = _scheduler(runner, ServerArgs(max_total_tokens=400))
    first = SYSTEM + (41, 42)  # 32 tokens
    long = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)
    sched.add_request(GenerateRequest("t0", first, long))
    reply: list[int] = []
    while sched.has_work():
        for out in sched.step():
            reply.extend(out.new_token_ids)
    reply[35] = 3 if reply[35] != 3 else 4  # position 32 + 35 = 67 tokenizes otherwise
    second = first + tuple(reply) + (44, 45)
    assert _run(sched, [("t1", second)])["t1"] == _alone(second)
    # generated tokens are snapshotted every 16 positions: 48, 64 (then the end, 71)
    assert sched.stats().cache_hit_tokens == 64


def test_snapshots_stay_within_their_budget_and_die_with_their_nodes():
    runner = RecurrentRunner(120, snapshot_budget=3 * SNAPSHOT_BYTES)
    sched = _scheduler(runner, ServerArgs(max_total_tokens=120, max_running_requests=4))
    for i in range(12):
        _run(sched, [(str(i), (2 + i % 5, *range(10 + i, 30 + i)))])
        store = sched.cache.snapshots
        assert store is not None and store.count <= 3 and runner.live == store.count
    sched.cache.reset()
    assert runner.live == 0


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[int, tuple[int, ...], int | None]]:
    stems = (SYSTEM, tuple(range(45, 20, -1)))
    jobs = []
    for _ in range(draw(st.integers(1, 9))):
        stem = stems[draw(st.integers(0, 1))][: draw(st.integers(0, 30))]
        tail = tuple(draw(st.lists(st.integers(2, VOCAB - 1), min_size=1, max_size=10)))
        arrive = draw(st.integers(0, 10))
        abort = draw(st.none() | st.integers(arrive, arrive + 12))
        jobs.append((arrive, stem + tail, abort))
    return jobs


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    work=workloads(),
    pool=st.sampled_from([90, 300]),
    budget=st.sampled_from([1, 4, 50]),
    chunk=st.sampled_from([0, 8]),
    mixed=st.sampled_from(["on", "off"]),
)
def test_random_workloads_give_the_tokens_of_each_request_alone(work, pool, budget, chunk, mixed):
    runner = RecurrentRunner(pool, snapshot_budget=budget * SNAPSHOT_BYTES)
    args = ServerArgs(
        max_total_tokens=pool,
        chunked_prefill_size=chunk,
        mixed_prefill=mixed,
        max_running_requests=5,
        new_token_ratio=0.05,  # admit eagerly so the small pool has to retract
    )
    sched = _scheduler(runner, args)
    params = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
    got: dict[str, list[int]] = {}
    step = 0
    while step <= 22 or sched.has_work():
        for i, (arrive, prompt, abort) in enumerate(work):
            if arrive == step:
                sched.add_request(GenerateRequest(str(i), prompt, params))
            if abort == step:
                sched.abort(str(i))
        for out in sched.step():
            got.setdefault(out.rid, []).extend(out.new_token_ids)
        if sched.idle:
            sched.check_invariants(idle=True)
        step += 1
        assert step < 3000, "the scheduler stopped making progress"
    sched.check_invariants(idle=True)
    assert runner.live == sched.cache.snapshots.count
    for i, (_, prompt, abort) in enumerate(work):
        if abort is None:
            assert got[str(i)] == _alone(prompt, params), f"request {i}"
