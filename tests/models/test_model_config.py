"""ModelConfig parsing, RoPE frequencies and the architecture registry."""

from __future__ import annotations

import pytest
import torch

from localradix.models import ModelConfig, RopeScaling, get_model_class, is_supported
from localradix.models.rotary import inverse_frequencies

BASE = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
)


def test_transformers4_style_keys():
    c = ModelConfig.from_hf_dict(
        {
            **BASE,
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "rope_theta": 500000.0,
            "rope_scaling": {"type": "linear", "factor": 2.0},
            "eos_token_id": [128001, 128009],
        }
    )
    assert c.num_key_value_heads == 4 and c.head_dim == 16
    assert c.rope_theta == 500000.0 and c.rope_scaling == RopeScaling("linear", 2.0)
    assert c.eos_token_ids == (128001, 128009)
    assert not c.attention_bias and not c.qk_norm


def test_transformers5_rope_parameters_and_model_type_defaults():
    c = ModelConfig.from_hf_dict(
        {
            **BASE,
            "model_type": "qwen2",
            "num_key_value_heads": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
            "eos_token_id": 7,
            "sliding_window": 4096,
            "use_sliding_window": False,
        }
    )
    assert c.architecture == "Qwen2ForCausalLM" and c.attention_bias and not c.qk_norm
    assert c.rope_theta == 1e6 and c.rope_scaling.rope_type == "default"
    assert c.eos_token_ids == (7,) and c.sliding_window is None
    q3 = ModelConfig.from_hf_dict({**BASE, "model_type": "qwen3", "head_dim": 32})
    assert q3.qk_norm and q3.head_dim == 32 and q3.q_size == 128


def test_dict_roundtrip():
    c = ModelConfig.from_hf_dict(
        {
            **BASE,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "original_max_position_embeddings": 64,
            },
        }
    )
    assert ModelConfig.from_dict(c.to_dict()) == c


def test_llama3_frequencies_match_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    }
    scaling["original_max_position_embeddings"] = 8192
    hf = LlamaConfig(
        hidden_size=4096, num_attention_heads=32, rope_theta=500000.0, rope_scaling=scaling
    )
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    ours = inverse_frequencies(128, 500000.0, RopeScaling.from_hf(scaling))
    torch.testing.assert_close(ours, expected)


def test_unsupported_rope_type_fails_clearly():
    with pytest.raises(NotImplementedError, match="dynamic"):
        inverse_frequencies(64, 10000.0, RopeScaling("dynamic", 4.0))


def test_registry():
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert is_supported(name)
        assert get_model_class(name).__name__ == "DecoderForCausalLM"
    with pytest.raises(
        ValueError, match="does not implement 'GPT2LMHeadModel'.*--backend llamacpp"
    ):
        get_model_class("GPT2LMHeadModel")


def test_missing_weight_is_reported():
    from localradix.models.decoder import DecoderForCausalLM

    config = ModelConfig.from_hf_dict({**BASE, "model_type": "llama"})
    model = DecoderForCausalLM(config)
    with pytest.raises(ValueError, match="missing"):
        model.load_weights([("model.embed_tokens.weight", torch.zeros(100, 64))])
    with pytest.raises(ValueError, match="shape"):
        model.load_weights([("model.norm.weight", torch.zeros(65))])
    with pytest.raises(ValueError, match="unexpected"):
        model.load_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(1))])
