"""Phi-3 / Phi-4-mini (fused weights, longrope, partial RoPE) and SmolLM3 (layers without RoPE)
through the Engine on the CPU backend, greedy token for token like transformers: alone, batched
and cached, chunked, retracted. Also their config parsing, RoPE tables and TP refusal. (MLX:
tests/backends/test_mlx_families.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from engine.conftest import VOCAB, random_prompts

from localradix.models import ModelConfig
from models.family_parity import (
    check_alone_batched_cached,
    check_chunked,
    check_retraction,
    check_tp_refuses,
    save_checkpoint,
)

transformers = pytest.importorskip("transformers")

ORIGINAL = 32  # longrope's pretraining length: generation crosses it, so long factors are used
NEW = 40


def _common(layers: int) -> dict[str, object]:
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=1,
        bos_token_id=2,
        pad_token_id=0,
        initializer_range=0.2,  # peaky logits: greedy ties between batched paths are unlikely
    )


def _longrope(pairs: int) -> dict[str, object]:
    """Distinct short and long divisors per frequency, so using the wrong set shows."""
    g = torch.Generator().manual_seed(1)
    short = (1.0 + 0.5 * torch.rand(pairs, generator=g)).tolist()
    long = (2.0 + 6.0 * torch.rand(pairs, generator=g)).tolist()
    return {"type": "longrope", "short_factor": short, "long_factor": long}


def _configs() -> dict[str, object]:
    t = transformers
    longrope = dict(max_position_embeddings=256, original_max_position_embeddings=ORIGINAL)
    return {
        "phi3": t.Phi3Config(**_common(2), **longrope, rope_scaling=_longrope(8)),
        # Phi-4-mini's shape: RoPE on 3/4 of each head (12 of 16 dims), longrope, tied head
        "phi4": t.Phi3Config(
            **_common(2),
            **longrope,
            partial_rotary_factor=0.75,
            rope_scaling=_longrope(6),
            tie_word_embeddings=True,
        ),
        # no_rope_layers: 1 = RoPE, 0 = NoPE (layers 1 and 3 see no positions)
        "smollm3": t.SmolLM3Config(
            **_common(4), max_position_embeddings=1024, no_rope_layers=[1, 0, 1, 0]
        ),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, object]]:
    """name -> (saved folder, the transformers model in fp32 eval mode)."""
    out = {}
    for name, config in _configs().items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        out[name] = save_checkpoint(tmp_path_factory, name, model)
    return out


def _prompts(name: str, seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    # transformers runs a prompt longer than ORIGINAL in one call with the long factors at
    # every position (a whole-call switch no KV cache can follow): keep longrope prompts short
    if name != "smollm3":
        lengths = tuple(min(n, ORIGINAL) for n in lengths)
    return random_prompts(seed, lengths)


@pytest.mark.parametrize("name", ["phi3", "phi4", "smollm3"])
def test_alone_batched_and_cached_match_transformers(models, name):
    # Prompt 2 runs on into its own greedy output, past ORIGINAL: its cached KV (from decode,
    # short then long factors) must continue transformers' token-by-token run.
    prompts = _prompts(name, 1, (5, 17, 32, 24, 3))
    _, (longer,) = check_alone_batched_cached(
        *models[name], prompts, NEW, runs_on=[(2, NEW - 10, 10)]
    )
    assert longer.cached_tokens > ORIGINAL


@pytest.mark.parametrize("name", ["phi3", "phi4", "smollm3"])
def test_chunked_prefill_matches(models, name):
    # then each prompt plus most of its output, prefilled in chunks across ORIGINAL, cache off
    check_chunked(*models[name], _prompts(name, 2, (70, 33, 9)), NEW, chunk=16, tail=8)


@pytest.mark.parametrize("name", ["phi4", "smollm3"])
def test_retraction_under_kv_pressure_matches(models, name):
    # 6 x (30 + 40) tokens do not fit: decode must retract
    check_retraction(*models[name], _prompts(name, 4, (27, 28, 29, 30, 31, 32)), NEW, 250)


# ---- config, tables, refusals --------------------------------------------------------------


def _config(name: str) -> ModelConfig:
    return ModelConfig.from_hf_dict(_configs()[name].to_dict())


def test_configs_parse():
    phi3, phi4, smol = _config("phi3"), _config("phi4"), _config("smollm3")
    assert phi3.architecture == "Phi3ForCausalLM" and phi3.fused_qkv_gate_up
    s = phi4.rope_scaling
    assert s.rope_type == "longrope" and s.original_max_position_embeddings == ORIGINAL
    assert len(s.short_factor) == len(s.long_factor) == 6 and phi4.rotary_dim == 12
    assert s.attention_factor == pytest.approx(math.sqrt(1 + math.log(256 / 32) / math.log(32)))
    assert phi4.tie_word_embeddings and phi4.extensions()
    assert smol.rope_layers == (True, False, True, False) and not smol.fused_qkv_gate_up
    assert [smol.uses_rope(i) for i in range(4)] == [True, False, True, False]
    assert ModelConfig.from_dict(phi4.to_dict()) == phi4
    assert ModelConfig.from_dict(smol.to_dict()) == smol
    # SmolLM3 without the list: every 4th layer is NoPE, as transformers derives it
    d = {**_common(8), "model_type": "smollm3"}
    hf_flags = transformers.SmolLM3Config(**_common(8)).no_rope_layers
    assert ModelConfig.from_hf_dict(d).rope_layers == tuple(f == 1 for f in hf_flags)
    assert hf_flags == [1, 1, 1, 0, 1, 1, 1, 0]
    llama = ModelConfig.from_hf_dict(transformers.LlamaConfig(**_common(2)).to_dict())
    assert not llama.extensions() and llama.rotary_dim == llama.head_dim


def test_phi3_transformers4_keys():
    """A transformers 4 config.json (Phi-4-mini's keys): top-level pretraining length wins."""
    d = {
        **_common(2),
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "partial_rotary_factor": 0.75,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 6, "long_factor": [2.0] * 6},
    }
    c = ModelConfig.from_hf_dict(d)
    assert c.rotary_dim == 12 and c.rope_scaling.original_max_position_embeddings == 4096
    assert c.rope_scaling.short_factor == (1.0,) * 6
    assert c.rope_scaling.attention_factor == pytest.approx(
        math.sqrt(1 + math.log(32) / math.log(4096))
    )


@pytest.mark.parametrize("name", ["phi3", "phi4"])
def test_rotary_table_matches_transformers_both_sides_of_original(name):
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    from localradix.models.rotary import RotaryTable

    hf_config = _configs()[name]
    hf = Phi3RotaryEmbedding(hf_config)
    table = RotaryTable(_config(name), torch.float32, "cpu", max_positions=64)
    x = torch.zeros(1, 1, dtype=torch.float32)
    short = torch.arange(ORIGINAL)[None]  # one call within the pretraining length: short
    cos, sin = hf(x, short)
    ours_cos, ours_sin = table.lookup(short[0])
    half = table.rotary_dim // 2
    torch.testing.assert_close(ours_cos[:, 0], cos[0], rtol=0, atol=0)
    torch.testing.assert_close(ours_sin[:, 0, half:], sin[0, :, half:], rtol=0, atol=0)
    for p in (ORIGINAL, ORIGINAL + 7, 63):  # a decode step past it: long
        cos, sin = hf(x, torch.tensor([[p]]))
        ours_cos, ours_sin = table.lookup(torch.tensor([p]))
        torch.testing.assert_close(ours_cos[:, 0], cos[0], rtol=0, atol=0)
        torch.testing.assert_close(ours_sin[:, 0, half:], sin[0, :, half:], rtol=0, atol=0)


def test_tensor_parallel_refuses_fused_weights_only():
    from localradix.model_api.shard import Shard

    check_tp_refuses(_config("phi3"), "--tp 2 does not split Phi3ForCausalLM's fused")
    Shard(0, 2).check(_config("smollm3"))  # NoPE layers split by heads like any other
    local = Shard(1, 2).local_config(_config("smollm3"))
    assert local.rope_layers == (True, False, True, False)
