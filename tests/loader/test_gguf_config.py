"""GGUF metadata -> ModelConfig for any architecture (sizing), and the torch path's refusals.

The API process and `doctor` size a GGUF's KV from its metadata alone, whatever llama.cpp
architecture it is; the torch backend, which implements a few architectures, refuses the
others in one line that names the backend that runs them.
"""

from __future__ import annotations

import pytest

from localradix.loader.gguf_config import gguf_model_config
from localradix.loader.gguf_metadata import hf_config
from localradix.model_api.kv_layout import KVLayout

HYBRID = {  # a Qwen3.5-shaped header: every other layer recurrent (no KV)
    "general.architecture": "qwen35",
    "qwen35.block_count": 4,
    "qwen35.context_length": 4096,
    "qwen35.embedding_length": 64,
    "qwen35.feed_forward_length": 128,
    "qwen35.attention.head_count": 4,
    "qwen35.attention.head_count_kv": 2,
    "qwen35.attention.key_length": 64,
    "qwen35.attention.recurrent_layers": [True, False, True, False],
    "tokenizer.ggml.tokens": ["a"] * 300,
    "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.eot_token_id": 7,
}


def test_a_hybrid_header_sizes_kv_for_its_attention_layers_only():
    config = gguf_model_config(HYBRID)
    assert (config.architecture, config.num_hidden_layers, config.kv_layers) == ("qwen35", 4, 2)
    assert (config.vocab_size, config.head_dim, config.eos_token_ids) == (300, 64, (2, 7))
    layout = KVLayout.for_model(config, "float16")
    assert layout.bytes_per_token == 2 * 2 * 2 * 64 * 2  # 2 KV layers x K,V x 2 heads x 64 x f16


def test_per_layer_kv_heads_count_the_layers_that_have_some():
    meta = {**HYBRID, "qwen35.attention.head_count_kv": [0, 2, 0, 2]}
    del meta["qwen35.attention.recurrent_layers"]
    config = gguf_model_config(meta)
    assert (config.kv_layers, config.num_key_value_heads) == (2, 2)


def test_a_sliding_window_is_recorded():
    meta = {
        **HYBRID,
        "general.architecture": "gemma3",
        **{k.replace("qwen35", "gemma3"): v for k, v in HYBRID.items() if "qwen35" in k},
        "gemma3.attention.sliding_window": 512,
    }
    assert gguf_model_config(meta).sliding_window == 512


def test_torch_refuses_an_architecture_it_does_not_implement_naming_llamacpp():
    with pytest.raises(ValueError, match=r"'lfm2'.*serve it with --backend llamacpp"):
        hf_config(_as("lfm2"), set())


def _as(arch: str) -> dict:
    meta = {k.replace("qwen35", arch): v for k, v in HYBRID.items()}
    meta["general.architecture"] = arch
    return meta


EXPERT_NAMES = {"token_embd.weight", "blk.0.ffn_gate_exps.weight", "blk.0.attn_q.weight"}


def test_a_llama_gguf_with_experts_is_mixtral():
    meta = {**_as("llama"), "llama.expert_count": 8, "llama.expert_used_count": 2}
    config = hf_config(meta, EXPERT_NAMES)
    assert config["architectures"] == ["MixtralForCausalLM"]
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (8, 2)


def test_torch_refuses_experts_in_an_architecture_without_them_naming_llamacpp():
    with pytest.raises(ValueError, match=r"'qwen3' GGUFs with experts.*--backend llamacpp"):
        hf_config(_as("qwen3"), EXPERT_NAMES)
