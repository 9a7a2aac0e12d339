"""The fixture's own test: every family's tiny GGUF loads in llama-cpp-python, is the kind of
model its family is (architecture, recurrent / hybrid memory), and generates greedily."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import THREADS, family_params, generate, requires_llama_cpp
from .gguf_families import FAMILIES

pytestmark = [pytest.mark.slow, requires_llama_cpp]

# The GGUF architecture each family converts to (mixtral is llama with expert tensors).
ARCH = {
    "llama": "llama",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "qwen3_5": "qwen35",
    "gemma3_text": "gemma3",
    "gemma4_text": "gemma4",
    "gpt_oss": "gpt-oss",
    "phi3": "phi3",
    "mixtral": "llama",
    "granitemoehybrid": "granitehybrid",
    "lfm2": "lfm2",
    "smollm3": "smollm3",
    "mamba2": "mamba2",
}


def test_every_family_has_an_expected_architecture() -> None:
    assert set(ARCH) == set(FAMILIES)


@pytest.mark.parametrize("family", family_params())
def test_family_loads_and_generates(family: str, gguf_path: Callable[[str], Path]) -> None:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(gguf_path(family)),
        n_ctx=256,
        n_threads=THREADS,
        flash_attn=True,
        verbose=False,
    )
    try:
        assert llm.metadata["general.architecture"] == ARCH[family]
        kind = FAMILIES[family].kind
        assert llama_cpp.llama_model_is_recurrent(llm.model) == (kind == "recurrent")
        assert llama_cpp.llama_model_is_hybrid(llm.model) == (kind == "hybrid")
        assert llm.n_vocab() <= 49152  # a modest vocabulary keeps every test fast
        tokens = generate(llm, list(range(300, 340)), 6)
        assert len(tokens) == 6 and all(0 <= t < llm.n_vocab() for t in tokens)
        # Random weights, yet not degenerate: the context changes the next token somewhere.
        nexts = {
            generate(llm, [start, start + 1, start + 2, 339], 1) for start in range(400, 900, 50)
        }
        assert len(nexts) > 1, "the next token ignores the context"
    finally:
        llm.close()
