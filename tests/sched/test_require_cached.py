"""`GenerateRequest.require_cached_tokens`: a continuation (Responses' previous_response_id) is
served from the radix cache, or ends with PREFIX_EVICTED at admission, never silently
prefilled again. On the deterministic hash model of the overlap tests."""

from __future__ import annotations

import pytest

from localradix.config import ServerArgs
from localradix.messages import ErrorCode, GenerateRequest, RequestOutput
from localradix.sampling_params import SamplingParams
from localradix.sched.scheduler import Scheduler

from .test_overlap_scheduler import KVHashRunner, _scheduler

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
PROMPT = tuple(range(2, 23))  # 21 tokens


def _run(sched: Scheduler, msg: GenerateRequest) -> tuple[list[int], RequestOutput]:
    """Serve `msg` alone to its end: its tokens and its last output."""
    sched.add_request(msg)
    tokens: list[int] = []
    last = None
    while sched.has_work():
        for out in sched.step():
            assert out.rid == msg.rid
            tokens.extend(out.new_token_ids)
            last = out
    assert last is not None and last.finished
    sched.check_invariants(idle=True)
    return tokens, last


def _conversation(page: int) -> tuple[Scheduler, tuple[int, ...]]:
    """A scheduler that served PROMPT, and the continuation's prompt (prompt, output, more)."""
    sched = _scheduler(KVHashRunner(400), ServerArgs(max_total_tokens=400, page_size=page))
    output, _ = _run(sched, GenerateRequest("first", PROMPT, GREEDY))
    return sched, (*PROMPT, *output, 40, 41, 42)


@pytest.mark.parametrize("page", [1, 4])
def test_a_cached_continuation_is_served_from_the_cache(page):
    sched, follow = _conversation(page)
    done = len(PROMPT) + GREEDY.max_new_tokens - 1  # the last sampled token has no KV yet
    tokens, out = _run(sched, GenerateRequest("next", follow, GREEDY, require_cached_tokens=done))
    assert out.finish_reason == "length" and len(tokens) == GREEDY.max_new_tokens
    assert out.error is None and out.error_code is None
    assert out.cached_tokens >= done // page * page
    # The same tokens as without the requirement (on a fresh scheduler: nothing cached).
    fresh = _scheduler(KVHashRunner(400), ServerArgs(max_total_tokens=400, page_size=page))
    assert _run(fresh, GenerateRequest("cold", follow, GREEDY))[0] == tokens


@pytest.mark.parametrize("page", [1, 4])
def test_an_evicted_continuation_fails_with_prefix_evicted(page):
    sched, follow = _conversation(page)
    assert sched.cache.evict(10**6) > 0  # the cache lost the conversation
    tokens, out = _run(sched, GenerateRequest("next", follow, GREEDY, require_cached_tokens=20))
    assert tokens == [] and out.finish_reason == "error"
    assert out.error_code is ErrorCode.PREFIX_EVICTED
    assert out.error is not None and "resend the whole input" in out.error
    assert sched.stats().prompt_tokens_total == len(PROMPT) + len(follow)
    assert sched.pool.available == sched.pool.total  # nothing was prefilled for it
    # Without the requirement the same prompt is simply prefilled again.
    tokens, out = _run(sched, GenerateRequest("again", follow, GREEDY))
    assert out.finish_reason == "length" and len(tokens) == GREEDY.max_new_tokens


def test_a_partly_evicted_prefix_is_not_enough():
    sched, follow = _conversation(1)
    # A longer requirement than what the cache holds (the prompt was shared, its tail is not).
    need = len(PROMPT) + GREEDY.max_new_tokens + 2
    _, out = _run(sched, GenerateRequest("next", follow, GREEDY, require_cached_tokens=need))
    assert out.error_code is ErrorCode.PREFIX_EVICTED
    assert f"of the {need} prompt tokens" in (out.error or "")


def test_a_requirement_longer_than_the_prompt_is_refused_at_the_door():
    sched = _scheduler(KVHashRunner(100), ServerArgs(max_total_tokens=100))
    msg = GenerateRequest("bad", PROMPT, GREEDY, require_cached_tokens=len(PROMPT) + 1)
    _, out = _run(sched, msg)
    assert out.finish_reason == "error" and "require_cached_tokens" in (out.error or "")
