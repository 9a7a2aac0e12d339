"""StopChecker: the one place a stop string is decided (the detokenizer trusts `matched_stop`)."""

from __future__ import annotations

import numpy as np

from localradix.sampling_params import SamplingParams
from localradix.sched.request import Req
from localradix.sched.stop_check import StopChecker

TEXT = {1: "a", 2: "b", 3: "x", 4: "y"}


def _decode(ids: list[int]) -> str:
    return "".join(TEXT[i] for i in ids)


def _run(params: SamplingParams, tokens: list[int]) -> Req:
    checker = StopChecker(eos_token_ids=(), context_len=100, decode=_decode)
    req = Req.of("r", np.asarray([1, 2], dtype=np.int64), params)
    for token in tokens:
        req.progress.output_ids.append(token)
        checker.check(req, token)
        if req.finished:
            break
    return req


def test_a_stop_string_ends_the_request_at_the_token_that_completes_it():
    req = _run(SamplingParams(max_new_tokens=10, stop=["xy"]), [1, 3, 4, 1, 2])
    assert (req.outcome.finish_reason, req.outcome.matched_stop, req.progress.output_ids) == (
        "stop",
        "xy",
        [1, 3, 4],
    )


def test_the_last_allowed_token_completing_a_stop_string_is_a_stop_not_a_length():
    req = _run(SamplingParams(max_new_tokens=3, stop=["xy"]), [1, 3, 4])
    assert (req.outcome.finish_reason, req.outcome.matched_stop) == ("stop", "xy")
    req = _run(SamplingParams(max_new_tokens=3, stop=["xy"]), [1, 3, 1])
    assert (req.outcome.finish_reason, req.outcome.matched_stop) == ("length", None)
