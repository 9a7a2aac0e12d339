"""Greedy outputs equal transformers token for token: alone, batched, cached, chunked, retracted."""

from __future__ import annotations

import numpy as np
import pytest

from localradix import Engine, SamplingParams

from .conftest import VOCAB, hf_greedy

ARCHS = ["llama", "qwen2", "qwen3"]
NEW = 12
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)


def _prompts(seed: int, lengths=(5, 17, 40, 64, 3)) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, n).tolist() for n in lengths]


def _tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


@pytest.mark.parametrize("arch", ARCHS)
def test_alone_batched_and_cached_match_transformers(tiny_model, arch):
    folder, hf = tiny_model(arch)
    prompts = _prompts(1)
    # Requests that share a long prefix with each other, so the second pass hits the cache.
    shared = prompts[3]
    prompts += [shared + [7, 8, 9], shared[:50] + [11]]
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(str(folder), dtype="float32", max_total_tokens=4096) as engine:
        alone = [engine.generate([p], GREEDY)[0].token_ids for p in prompts]
        assert alone == refs
        again = engine.generate(prompts, GREEDY)  # batched, every prompt now cached
        assert _tokens(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts))
        engine.check_invariants(idle=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_matches(tiny_model, arch):
    folder, hf = tiny_model(arch)
    prompts = _prompts(2, lengths=(70, 33, 9))
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(
        str(folder), dtype="float32", max_total_tokens=4096, chunked_prefill_size=16
    ) as engine:
        assert _tokens(engine.generate(prompts, GREEDY)) == refs
        engine.check_invariants(idle=True)


def test_no_radix_cache_matches(tiny_model):
    folder, hf = tiny_model("llama")
    prompts = _prompts(3)
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(
        str(folder), dtype="float32", max_total_tokens=4096, disable_radix_cache=True
    ) as engine:
        assert _tokens(engine.generate(prompts, GREEDY)) == refs
        assert _tokens(engine.generate(prompts, GREEDY)) == refs
        results = engine.generate(prompts, GREEDY)
        assert all(r.cached_tokens == 0 for r in results)
        engine.check_invariants(idle=True)


@pytest.mark.parametrize(
    ("policy", "overlap", "page_size"),
    [("lpm", "off", 1), ("fcfs", "off", 1), ("dfs-weight", "off", 1), ("lpm", "on", 1)]
    + [("fcfs", "on", 4)],
)
def test_retraction_under_kv_pressure_matches(tiny_model, policy, overlap, page_size):
    folder, hf = tiny_model("llama")
    prompts = _prompts(4, lengths=(40, 41, 42, 43, 44, 45))
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    refs = [hf_greedy(hf, p, 40) for p in prompts]
    with Engine(
        str(folder),
        dtype="float32",
        max_total_tokens=300,  # 6 x (42 + 40) tokens do not fit: decode must retract
        new_token_ratio=0.05,
        schedule_policy=policy,
        overlap_schedule=overlap,  # on: tokens are read one step behind the launches
        page_size=page_size,
    ) as engine:
        results = engine.generate(prompts, params)
        assert _tokens(results) == refs
        assert engine.stats().retractions > 0
        engine.check_invariants(idle=True)


@pytest.mark.parametrize("page_size", [4, 16])
def test_paged_kv_matches(tiny_model, page_size):
    folder, hf = tiny_model("qwen2")
    prompts = _prompts(5, lengths=(37, 16, 50, 3))
    prompts.append(prompts[2][:32] + [9, 9])  # shares two or more whole pages with another
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(
        str(folder),
        dtype="float32",
        max_total_tokens=4096,
        page_size=page_size,
        chunked_prefill_size=24,
    ) as engine:
        assert [engine.generate([p], GREEDY)[0].token_ids for p in prompts] == refs
        again = engine.generate(prompts, GREEDY)
        assert _tokens(again) == refs
        assert again[2].cached_tokens == (len(prompts[2]) - 1) // page_size * page_size
        engine.check_invariants(idle=True)
    long = _prompts(6, lengths=(40, 41, 42, 43, 44, 45))
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    with Engine(
        str(folder),
        dtype="float32",
        max_total_tokens=320,
        new_token_ratio=0.05,
        page_size=page_size,
    ) as engine:
        assert _tokens(engine.generate(long, params)) == [hf_greedy(hf, p, 40) for p in long]
        assert engine.stats().retractions > 0
        engine.check_invariants(idle=True)
