"""Engine API behaviour on a tiny random Llama: sampling controls, stops, forks, abort, errors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from localradix import Engine, SamplingParams

from .conftest import VOCAB, hf_greedy

PROMPT = np.random.default_rng(7).integers(3, VOCAB, 30).tolist()


@pytest.fixture(scope="module")
def engine(tiny_model):
    folder, _ = tiny_model("llama")
    with Engine(str(folder), dtype="float32", max_total_tokens=4096, context_length=256) as eng:
        yield eng
        eng.check_invariants(idle=True)


@pytest.fixture(scope="module")
def reference(tiny_model):
    _, hf = tiny_model("llama")
    return hf_greedy(hf, PROMPT, 16)


def test_same_seed_same_output_any_batch(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=1234, ignore_eos=True)
    alone = engine.generate([PROMPT], params)[0].token_ids
    other = SamplingParams(temperature=1.0, max_new_tokens=16, ignore_eos=True)
    batched = engine.generate([PROMPT, PROMPT[:10], PROMPT], [params, other, params])
    assert batched[0].token_ids == alone == batched[2].token_ids
    different = engine.generate([PROMPT], params.replace(seed=99))[0].token_ids
    assert different != alone


def test_stop_token_id(engine, reference):
    stop = reference[3]
    first = reference.index(stop)
    params = SamplingParams(temperature=0, max_new_tokens=16, stop_token_ids=(stop,))
    result = engine.generate([PROMPT], params)[0]
    assert result.token_ids == reference[: first + 1]
    assert (result.finish_reason, result.matched_stop) == ("stop", stop)


def test_stop_string_cuts_text(engine, reference):
    word = f"w{reference[4]}"
    params = SamplingParams(temperature=0, max_new_tokens=16, stop=(word,), ignore_eos=True)
    result = engine.generate([PROMPT], params)[0]
    assert (result.finish_reason, result.matched_stop) == ("stop", word)
    assert word not in result.text
    assert len(result.token_ids) <= 5


def test_max_tokens_and_eos(engine, reference):
    result = engine.generate([PROMPT], SamplingParams(temperature=0, max_new_tokens=5))[0]
    assert result.finish_reason in ("length", "stop")
    assert result.token_ids == reference[: len(result.token_ids)]
    if result.finish_reason == "length":
        assert len(result.token_ids) == 5


def test_forks_share_the_prompt(engine, reference):
    prompt = PROMPT + [5, 6, 7, 8] * 10  # a fresh 70-token prompt
    params = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True, n=3)
    results = engine.generate([prompt], params)
    assert len(results) == 3
    assert results[0].token_ids == results[1].token_ids == results[2].token_ids
    # Only one fork prefills the new prompt; the others are deferred and hit the cache.
    assert sorted(r.cached_tokens for r in results)[1:] == [len(prompt) - 1] * 2


def test_logprobs(engine, reference):
    params = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True, logprobs=3)
    result = engine.generate([PROMPT], params)[0]
    assert len(result.logprobs) == 4
    for token, lp in zip(result.token_ids, result.logprobs):
        assert lp.token_id == token and lp.logprob <= 0
        assert [t for t, _ in lp.top][0] == token
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True) and len(values) == 3


def test_penalties_change_sampling(engine, reference):
    params = SamplingParams(
        temperature=0, max_new_tokens=16, ignore_eos=True, repetition_penalty=5.0
    )
    penalized = engine.generate([PROMPT], params)[0].token_ids
    seen = set(PROMPT)
    assert sum(t in seen for t in penalized) <= sum(t in seen for t in reference)
    assert penalized != reference


def test_stream_matches_generate_and_abort_frees_kv(engine):
    params = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)
    full = engine.generate([PROMPT], params)[0]

    async def collect(limit: int | None) -> str:
        text = ""
        async for chunk in engine.stream(PROMPT, params):
            text += chunk.text
            if limit is not None and len(chunk.token_ids) and limit == 0:
                break
            limit = None if limit is None else limit - 1
        return text

    assert asyncio.run(collect(None)) == full.text
    asyncio.run(collect(2))  # the consumer walks away: the request is aborted
    engine.check_invariants(idle=True)


def test_prompt_longer_than_context_is_a_clear_error(engine):
    result = engine.generate([list(range(3, 303))], SamplingParams(max_new_tokens=4))[0]
    assert result.finish_reason == "error"
    assert "300" in result.error and "256" in result.error


def test_prompt_that_can_never_fit_is_a_clear_error(tiny_model):
    folder, _ = tiny_model("llama")
    with Engine(str(folder), dtype="float32", max_total_tokens=64) as small:
        result = small.generate([list(range(3, 103))], SamplingParams(max_new_tokens=4))[0]
        assert result.finish_reason == "error" and "max-total-tokens" in result.error
        small.check_invariants(idle=True)
