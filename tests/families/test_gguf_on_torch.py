"""GGUFs of the 2026 families on the torch backend (`loader/gguf_arch.py`, `gguf_tensors.py`).

Each mapped family's tiny GGUF (llama.cpp's converter, `--outtype f16`) is served by
`Engine(gguf, backend="cpu", dtype="float32")`, and its greedy tokens must equal transformers'
on the fixture's own Hugging Face folder, with the weights rounded as the converter stored
them: F16 for every matrix, F32 for norms, MoE routers and Qwen3.5's conv1d. The GGUF's
weights are then bit-exactly the reference's (after undoing the converter's +1 on norms, its
V-head reorder and -exp(A_log), its split experts), so the comparison is exact up to float32
op order, over prompts longer than the 64-token windows. A second request sharing a prefix hits
the cache and still gives the reference's tokens. Every family the torch models do not
implement from GGUF is refused in one line naming `--backend llamacpp`.

Qwen3-MoE: llama.cpp's qwen3moe graph always renormalises the top-k routing weights, so a
GGUF means `norm_topk_prob: true` whatever the HF config said (the fixture's says false): the
reference uses true.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

MAPPED = ["phi3", "smollm3", "mixtral", "qwen3_moe", "gemma3_text", "gpt_oss", "qwen3_5"]
UNMAPPED = ["gemma4_text", "granitemoehybrid", "lfm2", "mamba2"]
NEW = 12
REFERENCE_OVERRIDES = {"qwen3_moe": {"norm_topk_prob": True}}  # llama.cpp's semantics
# kept F32 by the converter: norms, routers (gpt-oss's `mlp.router`), Qwen3.5's conv1d
F32_IN_GGUF = ("norm.weight", "mlp.gate.weight", "mlp.router.weight", "conv1d.weight")


def _ids(seed: int, n: int) -> list[int]:
    """Ids every fixture vocabulary has (SentencePiece ones hold 1,024), past the specials."""
    rng = random.Random(seed)
    return [rng.randrange(300, 1000) for _ in range(n)]


PREFIX = _ids(1, 80)
PROMPTS = [PREFIX + _ids(2, 20), _ids(3, 37)]
SHARED = PREFIX + _ids(4, 24)  # the cache-hit request: PROMPTS[0]'s first 80 tokens, then others


def _greedy(n: int = NEW) -> Any:
    from localradix.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


@contextmanager
def _engine(path: Path) -> Iterator[Any]:
    from localradix import Engine

    with Engine(str(path), backend="cpu", dtype="float32", max_total_tokens=2048) as engine:
        yield engine


def _run(engine: Any, prompts: list[list[int]]) -> list[Any]:
    results = engine.generate(prompts, _greedy())
    for r in results:
        assert r.error is None, f"{r.error_code}: {r.error}"
    return results


@pytest.fixture(scope="module")
def transformers_greedy(gguf_path: Callable[[str], Path]) -> Callable[[str, list[int]], list[int]]:
    """transformers' greedy tokens on the family's HF folder, weights rounded as in its GGUF."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    models: dict[str, Any] = {}

    def model_of(family: str) -> Any:
        if family not in models:
            folder = gguf_path(family).parent / "hf"
            config = AutoConfig.from_pretrained(folder)
            for key, value in REFERENCE_OVERRIDES.get(family, {}).items():
                setattr(config, key, value)
            model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if p.dim() >= 2 and not name.endswith(F32_IN_GGUF):
                        p.copy_(p.half().float())
            models[family] = model.eval()
        return models[family]

    def greedy(family: str, ids: list[int]) -> list[int]:
        model, tokens = model_of(family), list(ids)
        with torch.no_grad():
            for _ in range(NEW):
                logits = model(torch.tensor([tokens])).logits[0, -1]
                tokens.append(int(torch.argmax(logits)))
        return tokens[len(ids) :]

    return greedy


@pytest.mark.parametrize("family", MAPPED)
def test_gguf_greedy_equals_transformers_and_a_cache_hit_agrees(
    family: str, gguf_path: Callable[[str], Path], transformers_greedy: Any
) -> None:
    with _engine(gguf_path(family)) as engine:
        first = _run(engine, PROMPTS)
        shared = _run(engine, [SHARED])[0]  # after PROMPTS[0]: its prefix is cached
    for prompt, result in zip(PROMPTS, first):
        assert list(result.token_ids) == transformers_greedy(family, prompt)
    assert shared.cached_tokens >= len(PREFIX) - 16, shared.cached_tokens
    assert list(shared.token_ids) == transformers_greedy(family, SHARED)


@pytest.mark.parametrize("family", UNMAPPED)
def test_unmapped_families_are_refused_in_one_line_naming_llamacpp(
    family: str, gguf_path: Callable[[str], Path]
) -> None:
    from localradix.loader.model_loader import load_model

    with pytest.raises(ValueError) as refused:
        load_model(str(gguf_path(family)), dtype="float32")
    message = str(refused.value)
    assert "\n" not in message and "--backend llamacpp" in message, message


def test_phi3_longrope_factors_become_the_config_rope_scaling() -> None:
    """Phi-3 128k GGUFs store longrope's factors as tensors (no fixture has them)."""
    import numpy as np

    from localradix.loader.gguf_metadata import hf_config
    from localradix.models.config import ModelConfig

    meta = {
        "general.architecture": "phi3",
        "phi3.context_length": 131072,
        "phi3.rope.scaling.original_context_length": 4096,
        "phi3.rope.scaling.attn_factor": 1.19,
        "phi3.embedding_length": 64,
        "phi3.feed_forward_length": 128,
        "phi3.block_count": 2,
        "phi3.attention.head_count": 4,
        "phi3.rope.dimension_count": 12,  # Phi-4-mini-like: RoPE on 3/4 of each head
        "phi3.attention.sliding_window": 0,
        "tokenizer.ggml.tokens": ["a"] * 300,
    }
    factors = {
        "rope_factors_long.weight": np.arange(6, dtype=np.float32) + 1,
        "rope_factors_short.weight": np.ones(6, dtype=np.float32),
    }
    names = {"token_embd.weight", "output.weight", *factors}
    config = ModelConfig.from_hf_dict(hf_config(meta, names, factors.__getitem__))
    scaling = config.rope_scaling
    assert scaling.rope_type == "longrope" and config.partial_rotary_factor == 0.75
    assert tuple(scaling.long_factor) == (1, 2, 3, 4, 5, 6)
    assert scaling.original_max_position_embeddings == 4096
    assert scaling.attention_factor == pytest.approx(1.19)


def test_a_type_the_dequantiser_lacks_is_refused_naming_llamacpp() -> None:
    import numpy as np
    from gguf import GGMLQuantizationType

    from localradix.gguf_file import GGUFTensor
    from localradix.loader.gguf_tensors import HFTensor

    q8k = GGUFTensor(
        "blk.0.attn_q.weight", (1, 256), GGMLQuantizationType.Q8_K, np.zeros((1, 292), np.uint8)
    )
    with pytest.raises(ValueError) as refused:
        HFTensor("model.layers.0.self_attn.q_proj.weight", (1, 256), (q8k,), lambda a: a[0]).load()
    message = str(refused.value)
    assert "\n" not in message and "Q8_K" in message and "--backend llamacpp" in message, message


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_5", "gemma3_text"])
def test_the_converted_copy_holds_the_same_weights(
    family: str, gguf_path: Callable[[str], Path], tmp_path: Path, monkeypatch: Any
) -> None:
    """Big GGUFs load via a converted safetensors copy: the same tensors as the direct load."""
    import torch

    from localradix.loader import gguf_convert
    from localradix.loader.model_loader import load_model

    gguf = gguf_path(family)  # (resolved before the cache moves: the fixtures stay put)
    monkeypatch.setenv("LOCALRADIX_CACHE_DIR", str(tmp_path))
    direct = load_model(str(gguf), dtype="float32")[0].state_dict()
    monkeypatch.setattr(gguf_convert, "DIRECT_LOAD_MAX_PARAMS", 0)
    converted = load_model(str(gguf), dtype="float32")[0].state_dict()
    assert (tmp_path / "gguf").is_dir() and direct.keys() == converted.keys()
    for name, tensor in direct.items():
        assert torch.equal(tensor, converted[name]), name


@pytest.mark.parametrize("family", ["phi3", "mixtral"])
def test_mlx_refuses_gguf_layouts_it_cannot_map(
    family: str, gguf_path: Callable[[str], Path]
) -> None:
    """MLX maps only plain decoder GGUFs: a fused or expert layout is refused at load in one
    line, never loaded under wrong names."""
    pytest.importorskip("mlx.core")
    from localradix.backends.mlx.gguf_weights import load_gguf_weights

    with pytest.raises(ValueError) as refused:
        load_gguf_weights(gguf_path(family))
    message = str(refused.value)
    assert "\n" not in message and "--backend llamacpp" in message and "MLX" in message
