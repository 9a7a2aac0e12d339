"""GGUF metadata -> Hugging Face config.json dict, and end-of-generation ids.

The per-architecture differences are entries of `gguf_arch.GGUF_ARCHITECTURES`; tensor names
and the converter's weight transformations are `gguf_tensors`' (re-exported here). Anything
else is refused in one line naming `--backend llamacpp`.
"""

from __future__ import annotations

from typing import Any

from localradix.loader.gguf_arch import (
    GGUF_ARCHITECTURES,
    GGUFArch,
    TensorValues,
    architecture_of,
    experts_config,
)
from localradix.loader.gguf_tensors import hf_tensor_name, qk_heads, unpermute_qk

__all__ = [
    "GGUF_ARCHITECTURES",
    "GGUFArch",
    "architecture_of",
    "eos_token_ids",
    "hf_config",
    "hf_tensor_name",
    "qk_heads",
    "unpermute_qk",
]


def hf_config(
    meta: dict[str, Any], tensor_names: set[str], values: TensorValues | None = None
) -> dict[str, Any]:
    """An HF config.json dict equivalent to the GGUF metadata (`values` reads a tensor, for
    settings stored as tensors: Phi-3's longrope factors)."""
    arch = meta["general.architecture"]
    entry = architecture_of(meta)
    model_type, hf_arch = entry.model_type, entry.hf_arch
    experts = sorted(n for n in tensor_names if "_exps." in n)
    if experts:
        if entry.moe is None:
            raise ValueError(
                f"the torch backend does not implement {arch!r} GGUFs with experts "
                f"({experts[0]}): serve it with --backend llamacpp"
            )
        model_type, hf_arch = entry.moe

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
    if experts:
        config.update(experts_config(get, tensor_names, values))
    if entry.extra is not None:
        config.update(entry.extra(get, tensor_names, values))
    scaling = get("rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    elif scaling not in (None, "none") and "rope_scaling" not in config:  # (gpt-oss: its own)
        raise ValueError(
            f"the torch backend does not implement GGUF rope scaling {scaling!r}: "
            "serve it with --backend llamacpp"
        )
    return config


def eos_token_ids(meta: dict[str, Any]) -> list[int]:
    """End-of-generation ids: EOS, plus llama.cpp's EOT / EOM where the file names them."""
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    ids = [meta.get(f"tokenizer.ggml.{k}") for k in keys]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))
