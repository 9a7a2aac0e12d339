"""Greedy outputs equal transformers token for token: alone, batched, cached, chunked, retracted,
over shared prefixes; on the torch backend and, where MLX is installed, the MLX backend."""

from __future__ import annotations

import pytest

from localradix import Engine, SamplingParams

from .conftest import BACKENDS, hf_greedy, random_prompts, requires_mlx, token_lists

ARCHS = ["llama", "qwen2", "qwen3"]
NEW = 12
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_alone_batched_and_cached_match_transformers(tiny_model, arch, backend):
    folder, hf = tiny_model(arch)
    prompts = random_prompts(1)
    # Requests that share a long prefix with each other, so the second pass hits the cache.
    shared = prompts[3]
    prompts += [shared + [7, 8, 9], shared[:50] + [11]]
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(str(folder), backend=backend, dtype="float32", max_total_tokens=4096) as engine:
        assert engine.core.info.backend == backend
        alone = [engine.generate([p], GREEDY)[0].token_ids for p in prompts]
        assert alone == refs
        again = engine.generate(prompts, GREEDY)  # batched, every prompt now cached
        assert token_lists(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts))
        engine.check_invariants(idle=True)


CASCADE_MODULES = {
    "cpu": "localradix.runner.attention_torch",
    "mlx": "localradix.backends.mlx.attention",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_decode_over_a_shared_prefix_matches(tiny_model, arch, backend, monkeypatch):
    """Requests on one cached system prompt decode with cascade attention (the prompt's KV
    read once per step for all of them), token for token like transformers."""
    import importlib

    module = importlib.import_module(CASCADE_MODULES[backend])
    cascades = []
    real = module._cascade
    monkeypatch.setattr(module, "_cascade", lambda *a: cascades.append(1) or real(*a))
    folder, hf = tiny_model(arch)
    system = random_prompts(8, lengths=(150,))[0]
    prompts = [system + tail for tail in random_prompts(9, lengths=(3, 9, 1, 20))]
    prompts.append(random_prompts(10, lengths=(30,))[0])  # one that shares nothing
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(str(folder), backend=backend, dtype="float32", max_total_tokens=4096) as engine:
        engine.generate([system], SamplingParams(temperature=0, max_new_tokens=1))
        assert token_lists(engine.generate(prompts, GREEDY)) == refs
        engine.check_invariants(idle=True)
    assert len(cascades) >= 2 * (NEW - 1)  # every layer of every decode step


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_matches(tiny_model, arch, backend):
    folder, hf = tiny_model(arch)
    prompts = random_prompts(2, lengths=(70, 33, 9))
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(
        str(folder),
        backend=backend,
        dtype="float32",
        max_total_tokens=4096,
        chunked_prefill_size=16,
    ) as engine:
        assert token_lists(engine.generate(prompts, GREEDY)) == refs
        assert token_lists(engine.generate(prompts, GREEDY)) == refs  # now from the cache
        engine.check_invariants(idle=True)


def test_no_radix_cache_matches(tiny_model):
    folder, hf = tiny_model("llama")
    prompts = random_prompts(3)
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(
        str(folder), dtype="float32", max_total_tokens=4096, disable_radix_cache=True
    ) as engine:
        assert token_lists(engine.generate(prompts, GREEDY)) == refs
        assert token_lists(engine.generate(prompts, GREEDY)) == refs
        results = engine.generate(prompts, GREEDY)
        assert all(r.cached_tokens == 0 for r in results)
        engine.check_invariants(idle=True)


@pytest.mark.parametrize(
    ("policy", "overlap", "page_size", "backend"),
    [("lpm", "off", 1, "cpu"), ("fcfs", "off", 1, "cpu"), ("dfs-weight", "off", 1, "cpu")]
    + [("lpm", "on", 1, "cpu"), ("fcfs", "on", 4, "cpu")]
    + [pytest.param("lpm", "off", 1, "mlx", marks=requires_mlx)],
)
def test_retraction_under_kv_pressure_matches(tiny_model, policy, overlap, page_size, backend):
    folder, hf = tiny_model("llama")
    prompts = random_prompts(4, lengths=(40, 41, 42, 43, 44, 45))
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    refs = [hf_greedy(hf, p, 40) for p in prompts]
    with Engine(
        str(folder),
        backend=backend,
        dtype="float32",
        max_total_tokens=300,  # 6 x (42 + 40) tokens do not fit: decode must retract
        new_token_ratio=0.05,
        schedule_policy=policy,
        overlap_schedule=overlap,  # on: tokens are read one step behind the launches
        page_size=page_size,
    ) as engine:
        results = engine.generate(prompts, params)
        assert token_lists(results) == refs
        assert engine.stats().retractions > 0
        engine.check_invariants(idle=True)


@pytest.mark.parametrize("page_size", [4, 16])
def test_paged_kv_matches(tiny_model, page_size):
    folder, hf = tiny_model("qwen2")
    prompts = random_prompts(5, lengths=(37, 16, 50, 3))
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
        assert token_lists(again) == refs
        assert again[2].cached_tokens == (len(prompts[2]) - 1) // page_size * page_size
        engine.check_invariants(idle=True)
    long = random_prompts(6, lengths=(40, 41, 42, 43, 44, 45))
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    with Engine(
        str(folder),
        dtype="float32",
        max_total_tokens=320,
        new_token_ratio=0.05,
        page_size=page_size,
    ) as engine:
        assert token_lists(engine.generate(long, params)) == [hf_greedy(hf, p, 40) for p in long]
        assert engine.stats().retractions > 0
        engine.check_invariants(idle=True)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_gpu_way_around_masked_gqa_sdpa_matches(tiny_model, arch, monkeypatch):
    """On GPUs SDPA with a mask and GQA runs the slow math kernel, so there decodes of
    different lengths take grouped matmuls and masked extends repeat K/V per query head:
    forced here on the CPU, token for token like transformers."""
    import torch.nn.functional as F

    import localradix.runner.attention_torch as native

    monkeypatch.setattr(native, "GROUPED_WHEN_MASKED", True)
    calls: list[tuple[bool, bool]] = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kw):
        calls.append((kw.get("attn_mask") is not None, bool(kw.get("enable_gqa"))))
        return sdpa(*args, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    grouped = []
    cascade = native._cascade
    monkeypatch.setattr(native, "_cascade", lambda *a: grouped.append(1) or cascade(*a))
    folder, hf = tiny_model(arch)
    prompts = random_prompts(6, lengths=(70, 33, 9, 50))
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(
        str(folder), backend="cpu", dtype="float32", max_total_tokens=4096, chunked_prefill_size=24
    ) as engine:
        assert token_lists(engine.generate(prompts, GREEDY)) == refs
        engine.check_invariants(idle=True)
    assert (True, False) in calls  # a masked extend (a chunk after the first) with K/V repeated
    assert (True, True) not in calls  # no masked GQA SDPA at all
    assert len(grouped) >= 2 * (NEW - 1)  # every layer of every mixed-length decode step
