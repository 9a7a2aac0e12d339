"""--mixed-prefill (decodes ride along in prefill steps) and --max-cached-tokens (LRU budget of
cached-but-unused tokens), on the deterministic hash model of the overlap tests."""

from __future__ import annotations

from localradix.config import ServerArgs
from localradix.messages import GenerateRequest
from localradix.sampling_params import SamplingParams
from localradix.sched.scheduler import Scheduler

from .test_overlap_scheduler import KVHashRunner, _scheduler

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)


def _step_clocked(runner: KVHashRunner, args: ServerArgs) -> Scheduler:
    """A scheduler whose clock moves one second per step (one-off prefixes turn cold
    COLD_GRACE_S = 2 steps after they are cached)."""
    now = [0.0]
    sched = _scheduler(runner, args, clock=lambda: now[0])
    step = sched.step

    def stepped():
        now[0] += 1.0
        return step()

    sched.step = stepped  # type: ignore[method-assign]
    return sched


def _budgeted(max_total: int, budget: int) -> Scheduler:
    args = ServerArgs(max_total_tokens=max_total, max_cached_tokens=budget)
    return _step_clocked(KVHashRunner(max_total), args)


def _steps_to_finish(mixed: str) -> tuple[int, dict[str, list[int]]]:
    """One request decodes while three more arrive, one per step, each needing a prefill:
    (the step the first request finished at, every request's tokens)."""
    sched = _scheduler(KVHashRunner(1000), ServerArgs(max_total_tokens=1000, mixed_prefill=mixed))
    sched.add_request(GenerateRequest("first", (5, 6, 7), GREEDY))
    tokens: dict[str, list[int]] = {}
    steps, first_done = 0, 0
    while sched.has_work():
        if 1 <= steps <= 3:
            sched.add_request(GenerateRequest(f"late{steps}", (9, 10 + steps), GREEDY))
        for out in sched.step():
            tokens.setdefault(out.rid, []).extend(out.new_token_ids)
            first_done = steps if out.rid == "first" and out.finished else first_done
        steps += 1
    sched.check_invariants(idle=True)
    return first_done, tokens


def test_mixed_prefill_keeps_decoding_through_prefills_with_the_same_tokens():
    plain_steps, plain = _steps_to_finish("off")
    mixed_steps, mixed = _steps_to_finish("on")
    assert mixed == plain
    assert mixed_steps == plain_steps - 3  # it decoded in the 3 prefill steps instead of waiting


def test_mixed_prefill_is_on_by_default_only_where_the_runner_asks():
    runner = KVHashRunner(100)
    assert not _scheduler(runner, ServerArgs(max_total_tokens=100)).mixed
    runner.mixes_decode_into_prefill = True
    assert _scheduler(runner, ServerArgs(max_total_tokens=100)).mixed
    assert not _scheduler(runner, ServerArgs(max_total_tokens=100, mixed_prefill="off")).mixed


def test_while_busy_one_off_prompts_beyond_an_eighth_of_the_budget_go_least_recent_first():
    sched = _budgeted(1000, 160)
    long = SamplingParams(temperature=0.0, max_new_tokens=200, ignore_eos=True)
    sched.add_request(GenerateRequest("long", (3, 4), long))  # keeps the engine busy
    for i in range(4):  # 4 unrelated requests of 10 prompt + 8 new tokens: 17 cached each
        sched.add_request(GenerateRequest(str(i), tuple(range(10 * i + 5, 10 * i + 15)), GREEDY))
        for _ in range(12):
            sched.step()
        assert sched.cache.evictable_size <= 20
    assert sched.cache.match_prefix(tuple(range(35, 45))).matched_len == 10  # the newest stays
    assert sched.cache.match_prefix(tuple(range(5, 15))).matched_len == 0  # the oldest went
    while sched.has_work():
        sched.step()
    sched.check_invariants(idle=True)


def test_an_idle_engine_keeps_the_last_conversation_whole():
    args = ServerArgs(max_total_tokens=1000, max_cached_tokens=4)
    sched = _scheduler(KVHashRunner(1000), args)
    sched.add_request(GenerateRequest("turn1", tuple(range(2, 40)), GREEDY))
    while sched.has_work():
        sched.step()
    assert sched.cache.evictable_size == 38 + 7  # above the budget, yet nothing is running


class CachedAtLaunch(KVHashRunner):
    """Records, at every launch, the cached-but-unused tokens of its scheduler."""

    sched: Scheduler

    def __init__(self, kv_capacity: int) -> None:
        super().__init__(kv_capacity)
        self.seen: list[int] = []

    def forward(self, batch, sampling):
        self.seen.append(self.sched.cache.evictable_size)
        return super().forward(batch, sampling)


def test_the_budget_holds_at_every_launch():
    runner = CachedAtLaunch(1000)
    args = ServerArgs(max_total_tokens=1000, max_cached_tokens=15)
    sched = runner.sched = _step_clocked(runner, args)
    long = SamplingParams(temperature=0.0, max_new_tokens=30, ignore_eos=True)
    sched.add_request(GenerateRequest("long", (2, 3) * 30, long))  # keeps the engine busy
    for i in range(3):  # each leaves 4 + 7 tokens cached
        sched.add_request(GenerateRequest(str(i), (10 + i, 20 + i, 30 + i, 40 + i), GREEDY))
        for _ in range(9):
            sched.step()
    while sched.has_work():
        sched.step()
    assert all(cached <= 15 for cached in runner.seen)
    assert max(runner.seen) > 0  # it keeps some, not nothing


def test_the_runner_sets_the_default_budget_and_the_flag_overrides_it():
    runner = KVHashRunner(1000)
    assert _scheduler(runner, ServerArgs(max_total_tokens=1000)).cached_budget is None
    runner.idle_cache_budget = 30  # a runner whose idle cached KV slows every step
    assert _scheduler(runner, ServerArgs(max_total_tokens=1000)).cached_budget == 30
    args = ServerArgs(max_total_tokens=1000, max_cached_tokens=500)
    assert _scheduler(runner, args).cached_budget == 500


def test_one_off_prompts_are_trimmed_before_a_conversation():
    """Requests that found little cached leave cold prefixes, kept within an eighth of the
    budget; a request that continued a cached prefix leaves a warm one, kept within all of it."""
    sched = _budgeted(2000, 80)
    long = SamplingParams(temperature=0.0, max_new_tokens=400, ignore_eos=True)
    sched.add_request(GenerateRequest("long", (3, 4), long))  # keeps the engine busy
    history = (46, 47, 48, 49, *range(6, 30))
    sched.add_request(GenerateRequest("turn1", history, GREEDY))  # found nothing: a one-off
    while not any(out.rid == "turn1" and out.finished for out in sched.step()):
        pass
    sched.add_request(GenerateRequest("other", tuple(range(60, 90)), GREEDY))  # a one-off too
    sched.step()  # the client's round trip: a step runs before the next turn arrives
    turn2 = history + (2,) * 8  # mostly cached, within the grace: its history is warm again
    sched.add_request(GenerateRequest("turn2", turn2, GREEDY))
    for i in range(4):  # one-off prompts, 10 + 8 tokens each
        sched.add_request(GenerateRequest(str(i), tuple(range(10 * i + 5, 10 * i + 15)), GREEDY))
        for _ in range(12):
            sched.step()
        assert sched.cache.evictable_cold_size(sched.clock()) <= 80 // 8
    assert sched.cache.match_prefix(turn2).matched_len == len(turn2)  # the conversation stays
    assert sched.cache.match_prefix(tuple(range(5, 15))).matched_len == 0  # one-offs went
    assert sched.cache.match_prefix(tuple(range(60, 90))).matched_len == 0
