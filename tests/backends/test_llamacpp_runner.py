"""The llamacpp backend on the bundled GGUF, against llama.cpp's own single-sequence greedy decode.

The reference is llama-cpp-python's `Llama.generate` (one sequence, greedy sampler, its own
context). Under localradix's scheduler the same prompts must give the same tokens alone, in a
mixed batch, from a cache hit, with chunked prefill and after forced retractions; whenever the
engine goes idle the scheduler checks that llama.cpp's sequences agree with the slot pool
(`LlamaCppRunner.check_kv`), and a capacity probe shows llama.cpp holds exactly as many cells
as the radix tree caches.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localradix.config import ServerArgs
from localradix.messages import GenerateRequest
from localradix.sampling_params import SamplingParams

from .conftest import HAS_LLAMA_CPP, bundled_gguf

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed (localradix[llamacpp])"
    ),
]

TEXTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a village by the sea,",
    "List three colours of the rainbow:",
)
NEW = 24


@pytest.fixture(scope="module")
def model_path():
    return str(bundled_gguf())


@pytest.fixture(scope="module")
def prompts(model_path):
    from localradix.loader import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model(model_path))
    return [tuple(tokenizer.encode(t)) for t in TEXTS]


@pytest.fixture(scope="module")
def reference(model_path, prompts):
    """llama.cpp's own greedy tokens for each prompt, one sequence at a time."""
    from llama_cpp import Llama

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    llm = Llama(model_path=model_path, n_ctx=1024, n_threads=2, flash_attn=True, verbose=False)
    out = []
    for ids in prompts:
        tokens = []
        for token in llm.generate(list(ids), temp=0.0, reset=True):
            tokens.append(int(token))
            if len(tokens) == NEW:
                break
        out.append(tuple(tokens))
    llm.close()
    return out


@contextmanager
def _core(model_path, **kw):
    from localradix.engine.core import EngineCore

    core = EngineCore(ServerArgs(model=model_path, backend="llamacpp", threads=2, **kw))
    try:
        yield core
    finally:
        core.scheduler.runner.close()  # llama.cpp's buffers, now rather than at a GC cycle


def _run(core, jobs):
    """jobs: (rid, token ids, params); returns rid -> (tokens, cached tokens)."""
    for rid, ids, params in jobs:
        core.add_request(GenerateRequest(rid, tuple(ids), params))
    tokens: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    while core.has_work():
        for out in core.step():
            assert out.error is None, out.error
            tokens.setdefault(out.rid, []).extend(out.new_token_ids)
            cached[out.rid] = out.cached_tokens
    core.scheduler.check_invariants(idle=True)
    return {rid: (tuple(t), cached[rid]) for rid, t in tokens.items()}


def _greedy(n=NEW):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def test_alone_batched_and_cached_equal_llama_cpp(model_path, prompts, reference):
    with _core(model_path, max_total_tokens=2048) as core:
        for i, ids in enumerate(prompts):
            got = _run(core, [(f"alone{i}", ids, _greedy())])
            assert got[f"alone{i}"][0] == reference[i], f"prompt {i} alone"
        core.flush_cache()
        batched = _run(core, [(f"b{i}", ids, _greedy()) for i, ids in enumerate(prompts)])
        hits = _run(core, [(f"h{i}", ids, _greedy()) for i, ids in enumerate(prompts)])
    assert [batched[f"b{i}"][0] for i in range(len(prompts))] == reference
    assert [hits[f"h{i}"][0] for i in range(len(prompts))] == reference
    assert all(hits[f"h{i}"][1] == len(ids) - 1 for i, ids in enumerate(prompts))


def test_chunked_prefill_and_retraction_equal_llama_cpp(model_path, prompts, reference):
    # 8-token chunks, and a pool too small for all four requests to decode to the end.
    small = dict(max_total_tokens=96, chunked_prefill_size=8, new_token_ratio=0.05)
    with _core(model_path, **small) as core:
        got = _run(core, [(f"r{i}", ids, _greedy()) for i, ids in enumerate(prompts)])
        assert core.scheduler.retractions > 0
    assert [got[f"r{i}"][0] for i in range(len(prompts))] == reference


def test_a_shared_prefix_is_computed_once(model_path, prompts, reference):
    stem = prompts[2]
    with _core(model_path, max_total_tokens=2048) as core:
        first = _run(core, [("first", stem, _greedy(4))])
        second = _run(core, [("second", stem + (28, 29, 30), _greedy(4))])
        assert _llama_cells_in_use(core) == core.scheduler.cache.total_size
    assert first["first"][0] == reference[2][:4]
    assert second["second"][1] == len(stem)  # attached to the cached cells, not re-prefilled


def test_aborts_and_eviction_leave_llama_cpp_consistent(model_path, prompts):
    with _core(model_path, max_total_tokens=128) as core:
        for i, ids in enumerate(prompts):
            core.add_request(GenerateRequest(f"a{i}", ids, _greedy(40)))
        for _ in range(6):
            core.step()
        core.abort("a1")
        core.abort("a3")
        while core.has_work():
            core.step()
        core.scheduler.check_invariants(idle=True)
        assert _llama_cells_in_use(core) == core.scheduler.cache.total_size
        core.flush_cache()
        assert _llama_cells_in_use(core) == 0


# llama.cpp's logits move by up to ~0.07 nats with where a sequence's cells sit in the pool
# (measured: the same prompt alone in a fresh context vs after other requests came and went),
# while batch composition and `seq_cp` sharing leave them bit-identical. So a random workload
# must match one-at-a-time runs token for token until a near-tie: where the two differ, the
# reference's token must have been within TIE nats of the one chosen (after that they diverge).
# CI once saw 0.31 nats at a flat step (chosen token at p = 0.095) after a retraction, where
# the request's KV is recomputed as a prefill: llama.cpp's prefill and decode logits differ by
# up to ~0.1-0.3 nats on this Q4_1 model (8-bit activations). A wrong KV shows as whole nats.
TIE = 0.5


@settings(
    max_examples=int(os.environ.get("LLAMACPP_EXAMPLES", 6)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    picks=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 6), st.integers(1, 12)), min_size=2, max_size=6
    ),
    abort=st.none() | st.integers(0, 5),
)
def test_random_workloads_equal_one_at_a_time(model_path, prompts, picks, abort):
    """Shared prefixes (prompt stems), aborts, eviction and retraction under a tiny cell budget."""
    params = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True, logprobs=5)
              for _, _, n in picks]  # fmt: skip
    jobs = [
        (str(i), prompts[p][: len(prompts[p]) - cut] + (100 + i,), params[i])
        for i, (p, cut, _) in enumerate(picks)
    ]
    with _core(model_path, max_total_tokens=512, disable_radix_cache=True) as alone:
        expected = {rid: _run(alone, [(rid, ids, p)])[rid][0] for rid, ids, p in jobs}
    tiny = dict(max_total_tokens=64, max_running_requests=4, new_token_ratio=0.05)
    got: dict[str, list] = {}
    with _core(model_path, **tiny) as core:
        for rid, ids, p in jobs:
            core.add_request(GenerateRequest(rid, ids, p))
        steps = 0
        while core.has_work():
            if abort is not None and steps == 3:
                core.abort(str(abort))
            for out in core.step():
                got.setdefault(out.rid, []).extend(out.logprobs)
            steps += 1
        core.scheduler.check_invariants(idle=True)
        assert _llama_cells_in_use(core) == core.scheduler.cache.total_size
    for rid, logprobs in got.items():
        if rid != str(abort):
            _same_until_a_near_tie([lp.token_id for lp in logprobs], expected[rid], logprobs)


def _same_until_a_near_tie(tokens, expected, logprobs):
    diverge = next((j for j, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
    if diverge is None:
        assert len(tokens) == len(expected)
        return
    chosen = logprobs[diverge]
    alternatives = dict(chosen.top)
    gap = chosen.logprob - alternatives.get(expected[diverge], float("-inf"))
    assert gap <= TIE, f"token {diverge}: {tokens} vs {expected}, gap {gap:.3f} nats"


def _llama_cells_in_use(core) -> int:
    """Count llama.cpp's used cells from outside: fill the free ones with a probe sequence."""
    runner = core.scheduler.runner
    llama, probe = runner.llama, runner.n_seq - 1  # the cache tiers' spare: outside the map
    assert probe >= runner.seqs.n_seq and runner._pos_max(probe) == -1
    n_cells = int(llama.llama_n_ctx(runner.ctx))
    free, step = 0, min(256, runner.batch.capacity)
    while step:  # llama_decode returns 1, having changed nothing, when the cells run out
        positions = np.arange(free, free + step)
        runner.batch.fill(np.ones(step), positions, np.full(step, probe), np.array([step - 1]))
        if llama.llama_decode(runner.ctx, runner.batch.struct) == 0:
            free += step
        else:
            step //= 2
        assert free <= n_cells
    runner.seq_rm(probe, -1, -1)
    return n_cells - free


def test_idle_cached_cells_are_bounded_by_the_models_size(model_path):
    """Every live cell costs attention time in every step: the default --max-cached-tokens
    keeps a few thousand idle cells for a 135M model, never more than the cache holds."""
    with _core(model_path, max_total_tokens=32768) as core:
        assert 2048 <= core.scheduler.cached_budget <= 8192
    with _core(model_path, max_total_tokens=1536) as core:
        assert core.scheduler.cached_budget == 1536
    with _core(model_path, max_total_tokens=1536, max_cached_tokens=100) as core:
        assert core.scheduler.cached_budget == 100
