"""The ModelConfig of any GGUF, read from its metadata alone (no architecture table).

What sizing and listing need (layers, heads, context, vocabulary) is written under the same
keys for every architecture llama.cpp converts: `<arch>.block_count`,
`<arch>.attention.head_count[_kv]` (a number, or one per layer), and so on. Layers without KV
(the recurrent layers of hybrid models, where `head_count_kv` is 0 or
`attention.recurrent_layers` says so) are not counted as KV layers, so a hybrid model's KV is
not over-reserved. The torch models still need `gguf_metadata.hf_config`, which knows the
tensor layout of the architectures they implement.
"""

from __future__ import annotations

from typing import Any

from localradix.models.config import ModelConfig


def gguf_model_config(meta: dict[str, Any]) -> ModelConfig:
    arch = str(meta.get("general.architecture", "llama"))

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    layers = int(get("block_count", 0))
    heads = _largest(get("attention.head_count", 0))
    kv_heads = get("attention.head_count_kv", heads)
    hidden = int(get("embedding_length", 0))
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    return ModelConfig(
        architecture=arch,
        model_type=arch,
        vocab_size=int(get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))),
        hidden_size=hidden,
        intermediate_size=_largest(get("feed_forward_length", 0)),
        num_hidden_layers=layers,
        kv_layers=_kv_layers(layers, kv_heads, get("attention.recurrent_layers")),
        num_attention_heads=heads,
        num_key_value_heads=max(_largest(kv_heads), 1),
        head_dim=int(get("attention.key_length") or hidden // max(heads, 1)),
        max_position_embeddings=int(get("context_length", 2048)),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(int(i) for i in eos if i is not None)),
        sliding_window=get("attention.sliding_window"),
    )


def _largest(value: Any) -> int:
    """A per-layer list's largest entry, or the number itself."""
    return int(max(value, default=0)) if isinstance(value, list) else int(value or 0)


def _kv_layers(layers: int, kv_heads: Any, recurrent: Any) -> int:
    """Layers that hold KV: all but those with no KV heads or marked recurrent."""
    if isinstance(recurrent, list) and len(recurrent) == layers:
        return max(layers - sum(bool(r) for r in recurrent), 1)
    if isinstance(kv_heads, list) and len(kv_heads) == layers:
        return max(sum(int(k) > 0 for k in kv_heads), 1)
    return layers
