"""GGUF metadata -> Hugging Face config.json dict, tensor names, and a `tokenizers` tokenizer.

llama.cpp's converter permutes the Q/K rows of llama-architecture models (to interleaved RoPE);
`unpermute_qk` undoes it, as transformers' GGUF integration does. Qwen2/Qwen3 are not permuted.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

# GGUF `general.architecture` -> (HF model_type, HF architectures name, Q/K permuted?)
GGUF_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM", True),
    "mistral": ("mistral", "MistralForCausalLM", True),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", False),
    "qwen3": ("qwen3", "Qwen3ForCausalLM", False),
}

_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "model.rotary_emb.freq_factors",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def architecture_of(meta: dict[str, Any]) -> tuple[str, str, bool]:
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        known = ", ".join(sorted(GGUF_ARCHITECTURES))
        raise ValueError(
            f"the torch backend does not implement GGUF architecture {arch!r} (it runs {known}): "
            "serve it with --backend llamacpp"
        )
    return GGUF_ARCHITECTURES[arch]


def hf_config(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """An HF config.json dict equivalent to the GGUF metadata."""
    arch = meta["general.architecture"]
    model_type, hf_arch, _ = architecture_of(meta)
    experts = sorted(n for n in tensor_names if "_exps." in n)
    if experts:  # Mixtral converts to arch `llama`, with its experts stacked in `*_exps`
        raise ValueError(
            f"the torch backend does not implement mixture-of-experts GGUFs ({experts[0]}): "
            "serve it with --backend llamacpp"
        )

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    heads = get("attention.head_count")
    hidden = get("embedding_length")
    config: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": get("vocab_size") or len(meta["tokenizer.ggml.tokens"]),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv") or heads,
        "head_dim": get("attention.key_length") or hidden // heads,
        "max_position_embeddings": get("context_length", 2048),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    scaling = get("rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    elif scaling not in (None, "none"):
        raise ValueError(
            f"the torch backend does not implement GGUF rope scaling {scaling!r}: "
            "serve it with --backend llamacpp"
        )
    return config


def hf_tensor_name(name: str) -> str | None:
    """The HF parameter name of a GGUF tensor (None for tensors the models do not use)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _BLOCK.fullmatch(name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def unpermute_qk(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> HF rotate-half halves)."""
    dim = weights.shape[0] // num_heads // 2
    w = weights.reshape(num_heads, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)


def qk_heads(meta: dict[str, Any], hf_name: str) -> int | None:
    """Heads to un-permute by, if `hf_name` is a permuted Q/K tensor of this file."""
    _, _, permuted = architecture_of(meta)
    arch = meta["general.architecture"]
    if not permuted:
        return None
    if ".self_attn.q_proj." in hf_name:
        return meta[f"{arch}.attention.head_count"]
    if ".self_attn.k_proj." in hf_name:
        heads = meta[f"{arch}.attention.head_count"]
        return meta.get(f"{arch}.attention.head_count_kv") or heads
    return None


def eos_token_ids(meta: dict[str, Any]) -> list[int]:
    """End-of-generation ids: EOS, plus llama.cpp's EOT / EOM where the file names them."""
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    ids = [meta.get(f"tokenizer.ggml.{k}") for k in keys]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))
