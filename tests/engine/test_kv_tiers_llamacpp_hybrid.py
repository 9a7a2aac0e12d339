"""The cache tiers on llama.cpp's models with recurrent layers (tiny GGUFs of Qwen3.5's gated
delta-net and LFM2's short convolutions beside attention, and Mamba 2 alone): a prompt's KV
and recurrent state go to disk at a graceful stop (or when evicted) and come back after a
restart, and a follow-up resumes at the end of the shared prompt with the greedy tokens of a
cold server and of an in-memory hit. One thread: llama.cpp's sums are then bit-identical
whatever the cells' layout, so "equal" is exact."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from localradix import Engine, SamplingParams
from localradix.mem.kv_chunks import chain, state_digest

pytest.importorskip("llama_cpp")
from families.gguf_families import family_gguf  # noqa: E402

pytestmark = pytest.mark.slow

NEW = 8
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)
CHUNK = 32  # the tiers' chunk at --page-size 1


def prompts(seed: int, n: int = 300, question: int = 24) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(300, 40000, n).tolist()
    return prompt, prompt + rng.integers(300, 40000, question).tolist()


def engine(model: Path, disk: Path | None, **kw) -> Engine:
    where = {"kv_disk_cache": str(disk), "kv_disk_gib": 0.5} if disk else {"kv_disk_cache": "off"}
    kw = {"backend": "llamacpp", "threads": 1, "max_total_tokens": 2048, **where, **kw}
    return Engine(str(model), **kw)


def held(e: Engine, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The state snapshot at the end of `tokens` and their KV rows, as llama.cpp holds them."""
    match = e.core.scheduler.cache.match_prefix(np.array(tokens), count_hit=False)
    assert match.matched_len == len(tokens) and match.last_node.snapshot is not None
    runner = e.core.runner
    return runner.snapshots.export(match.last_node.snapshot), runner.kv_transfer.read(match.indices)


def cold(model: Path, prompt: list[int]) -> list[int]:
    with engine(model, None) as e:
        result = e.generate([prompt], GREEDY)[0]
        assert result.cached_tokens == 0
        return result.token_ids


@pytest.mark.parametrize("family", ["qwen3_5", "lfm2", "mamba2"])
def test_a_restart_resumes_the_shared_prompt_with_cold_greedy_tokens(tmp_path, family):
    model = family_gguf(family)
    prompt, follow_up = prompts(0)
    with engine(model, tmp_path) as e:
        assert e.core.scheduler.tiers is not None
        e.generate([prompt], GREEDY)
        in_memory = e.generate([follow_up], GREEDY)[0]
        assert in_memory.cached_tokens == len(prompt)
        state, kv = held(e, prompt)
    with engine(model, tmp_path) as e:  # a restart: the memory cache starts empty
        hit = e.generate([follow_up], GREEDY)[0]
        stats = e.stats().kv_tiers
        restored_state, restored_kv = held(e, prompt)
        e.check_invariants(idle=True)
    # The whole shared prompt (300 of the follow-up's 324 tokens) is cached, state and KV,
    # bit for bit (a tiny random model's tokens may not show a slightly wrong state).
    assert hit.cached_tokens == len(prompt)
    assert np.array_equal(restored_state, state) and np.array_equal(restored_kv, kv)
    assert stats["promoted_states"] == 1 and stats["disk_hit_tokens"] == len(prompt)
    assert hit.token_ids == in_memory.token_ids == cold(model, follow_up)


def test_an_evicted_prefix_comes_back_from_disk_with_its_state(tmp_path):
    model = family_gguf("qwen3_5")
    pairs = [prompts(seed) for seed in (1, 2, 3)]
    with engine(model, tmp_path, max_total_tokens=700) as e:  # the pool holds about two
        for prompt, _ in pairs:
            e.generate([prompt], GREEDY)
        hit = e.generate([pairs[0][1]], GREEDY)[0]  # evicted by the others: from disk
        stats = e.stats().kv_tiers
        e.check_invariants(idle=True)
    assert stats["demoted_states"] > 0 and stats["promoted_states"] == 1
    assert hit.cached_tokens == len(pairs[0][0])
    assert hit.token_ids == cold(model, pairs[0][1])


def test_a_corrupted_state_file_is_a_miss_with_one_warning(tmp_path, caplog):
    model = family_gguf("qwen3_5")
    prompt, follow_up = prompts(4)
    with engine(model, tmp_path) as e:
        e.generate([prompt], GREEDY)
    # The state at the prompt's end, the one the follow-up would resume from: named by the
    # chunk it follows and the tokens past it.
    whole = len(prompt) // CHUNK * CHUNK
    digest = state_digest(chain(np.array(prompt), None, CHUNK)[-1], np.array(prompt[whole:]))
    (path,) = tmp_path.glob(f"*/{digest.hex()[:2]}/{digest.hex()}.kv")
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x55
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING), engine(model, tmp_path) as e:
        hit = e.generate([follow_up], GREEDY)[0]
        corrupt = e.stats().kv_tiers["disk_corrupt"]
        e.check_invariants(idle=True)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "skipping and deleting" in warnings[0].getMessage()
    assert corrupt == 1 and not path.exists()
    # A miss for that state: the request resumes from an earlier one (a stride of the cold
    # prompt), never past it, and computes the rest.
    assert 0 < hit.cached_tokens < len(prompt)
    assert hit.token_ids == cold(model, follow_up)
