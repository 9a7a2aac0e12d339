"""The cache tiers on llama.cpp's sliding-window models (tiny GGUFs of Gemma 3 and gpt-oss,
window 64): a prompt's KV, full-attention and sliding-window layers both, goes to disk at a
graceful stop (or when evicted) and comes back after a restart bit for bit, and a follow-up
resumes at the end of the shared prompt with the greedy tokens of a cold server and of an
in-memory hit. One thread: llama.cpp's sums are then bit-identical whatever the cells' layout."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from localradix import Engine, SamplingParams
from localradix.backends.llamacpp.cell_blob import BlobError, CellLayout

pytest.importorskip("llama_cpp")
from families.gguf_families import family_gguf  # noqa: E402

pytestmark = pytest.mark.slow

NEW = 8
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)


def prompts(seed: int, vocab: int, n: int = 300) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(10, vocab, n).tolist()
    return prompt, prompt + rng.integers(10, vocab, 24).tolist()


def engine(model: Path, disk: Path | None, **kw) -> Engine:
    where = {"kv_disk_cache": str(disk), "kv_disk_gib": 0.5} if disk else {"kv_disk_cache": "off"}
    kw = {"backend": "llamacpp", "threads": 1, "max_total_tokens": 2048, **where, **kw}
    return Engine(str(model), **kw)


def held(e: Engine, tokens: list[int]) -> np.ndarray:
    """The KV rows of `tokens` as llama.cpp holds them (every layer, both caches)."""
    match = e.core.scheduler.cache.match_prefix(np.array(tokens), count_hit=False)
    assert match.matched_len == len(tokens)
    return e.core.runner.kv_transfer.read(match.indices)


def cold(model: Path, prompt: list[int]) -> list[int]:
    with engine(model, None) as e:
        result = e.generate([prompt], GREEDY)[0]
        assert result.cached_tokens == 0
        return result.token_ids


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_a_restart_resumes_the_shared_prompt_with_cold_greedy_tokens(tmp_path, family):
    model = family_gguf(family)
    with engine(model, tmp_path) as e:
        assert e.core.scheduler.tiers is not None and e.core.runner.window == 64
        prompt, follow_up = prompts(0, e.core.info.vocab_size)
        e.generate([prompt], GREEDY)
        in_memory = e.generate([follow_up], GREEDY)[0]
        assert in_memory.cached_tokens == len(prompt)
        kv = held(e, prompt)
    with engine(model, tmp_path) as e:  # a restart: the memory cache starts empty
        hit = e.generate([follow_up], GREEDY)[0]
        stats = e.stats().kv_tiers
        restored = held(e, prompt)
        e.check_invariants(idle=True)
    # The stop wrote all it cached, the follow-up included: all of it but its last token hits.
    assert hit.cached_tokens == stats["disk_hit_tokens"] == len(follow_up) - 1
    assert np.array_equal(restored, kv)  # both caches' K and V, every position of the prompt
    assert hit.token_ids == in_memory.token_ids == cold(model, follow_up)


def test_an_evicted_prefix_comes_back_from_disk(tmp_path):
    model = family_gguf("gemma3_text")
    with engine(model, tmp_path, max_total_tokens=700, max_cached_tokens=10_000) as e:
        pairs = [prompts(seed, e.core.info.vocab_size) for seed in (1, 2, 3)]
        for prompt, _ in pairs:  # the pool holds about two
            e.generate([prompt], GREEDY)
        hit = e.generate([pairs[0][1]], GREEDY)[0]  # evicted by the others: from disk
        stats = e.stats().kv_tiers
        e.check_invariants(idle=True)
    assert stats["disk_hit_tokens"] + stats.get("host_hit_tokens", 0) >= len(pairs[0][0]) // 2
    assert hit.cached_tokens >= len(pairs[0][0]) // 2
    assert hit.token_ids == cold(model, pairs[0][1])


def test_a_blob_that_does_not_parse_loses_its_tiers_not_the_engine(tmp_path, monkeypatch, caplog):
    """Demoting KV whose blob does not read is one warning; the engine serves on, exactly."""
    model = family_gguf("gemma3_text")
    with engine(model, tmp_path, max_total_tokens=700, max_cached_tokens=10_000) as e:
        pairs = [prompts(seed, e.core.info.vocab_size) for seed in (1, 2, 3)]

        def garbled(cls, blob, ext=0):
            raise BlobError("garbled")

        monkeypatch.setattr(CellLayout, "parse", classmethod(garbled))
        with caplog.at_level(logging.WARNING):
            for prompt, _ in pairs:  # the pool holds about two: evictions try to demote
                e.generate([prompt], GREEDY)
            again = e.generate([pairs[0][1]], GREEDY)[0]
        e.check_invariants(idle=True)
    assert "not keeping" in caplog.text and "does not parse: garbled" in caplog.text
    assert again.token_ids == cold(model, pairs[0][1])
