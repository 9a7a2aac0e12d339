"""Gemma 4's text config (transformers' `Gemma4TextConfig`, model_type "gemma4_text"), read
into `ModelConfig`: what Gemma 3 also has (per-layer sliding windows, a local and a global
RoPE, scaled embeddings, final-logit soft-capping) in `ModelConfig`'s own fields, the rest in
one `Gemma4Extras`. No torch here (`config.py` imports it).

Per-layer shapes: full-attention layers have `global_head_dim` (and, with `attention_k_eq_v`,
`num_global_key_value_heads`), so the KV cache is not uniform: `kv_layer_shapes` gives each KV
layer's (kv_heads, head_dim) (`model_api/kv_layout.py`). The last `num_kv_shared_layers` layers
compute no K/V of their own: each reads the last earlier layer of its attention type's
(`kv_sources`), so only the first `kv_layers` layers keep KV, and a model layer hands the
attention backend its KV layer's id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# transformers' defaults (Gemma4TextConfig.__post_init__)
_DEFAULT_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1e6,
    },
}
_ROPE_TYPES = ("default", "linear", "proportional")


@dataclass(frozen=True)
class Gemma4Rope:
    """One attention type's RoPE: over the whole head; "proportional" rotates the first
    `partial * head_dim / 2` frequency pairs and leaves the rest (frequency 0) unrotated."""

    rope_type: str = "default"
    theta: float = 10_000.0
    partial: float = 1.0
    factor: float = 1.0


@dataclass(frozen=True)
class Gemma4Extras:
    sliding: tuple[bool, ...]  # per layer: a sliding-window layer (else full attention)
    global_head_dim: int  # full-attention layers' head size (sliding ones: head_dim)
    global_kv_heads: int  # ... and KV heads
    k_eq_v: bool  # full-attention layers have no v_proj: values are the keys' projection
    kv_sources: tuple[int, ...]  # per layer: the KV layer it writes (its own) or reads (shared)
    first_shared: int  # layers from this one on reuse an earlier layer's K/V
    per_layer_size: int  # per-layer input embeddings' width a layer (0: none)
    per_layer_vocab: int
    double_wide_mlp: bool  # KV-shared layers' MLPs are twice intermediate_size wide
    local_rope: Gemma4Rope = Gemma4Rope()
    global_rope: Gemma4Rope = Gemma4Rope()

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> Gemma4Extras | None:
        """Inverse of `dataclasses.asdict` (ModelConfig.from_dict)."""
        if d is None:
            return None
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        for key in ("local_rope", "global_rope"):
            values[key] = Gemma4Rope(**values[key])
        return Gemma4Extras(**values)


def _rope(params: dict[str, Any], kind: str) -> Gemma4Rope:
    rope_type = params.get("rope_type", "default")
    if rope_type not in _ROPE_TYPES:
        raise ValueError(f"Gemma 4 {kind} RoPE type {rope_type!r} is not supported")
    return Gemma4Rope(
        rope_type,
        float(params.get("rope_theta", 10_000.0)),
        float(params.get("partial_rotary_factor") or 1.0) if rope_type == "proportional" else 1.0,
        float(params.get("factor") or 1.0) if rope_type != "default" else 1.0,
    )


def gemma4_fields(d: dict[str, Any], layers: int, kv_heads: int, head_dim: int) -> dict[str, Any]:
    """The `ModelConfig` fields of a Gemma 4 text config.json (`dataclasses.replace` them in)."""
    if d.get("use_bidirectional_attention"):
        raise ValueError("Gemma 4 with bidirectional attention is not a causal decoder")
    types = list(d.get("layer_types") or [])[:layers]
    if not types:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    types[-1] = "full_attention"  # (transformers forces it)
    sliding = tuple(t == "sliding_attention" for t in types)
    window = int(d.get("sliding_window") or 0)
    k_eq_v = bool(d.get("attention_k_eq_v", False))
    if d.get("per_layer_config") is not None:  # transformers 5's: overrides of the defaults
        per_layer = {int(k): v for k, v in d["per_layer_config"].items()}
        full: dict[str, Any] = next(
            (per_layer[i] for i in range(layers) if not sliding[i] and i in per_layer), {}
        )
        global_dim = int(full.get("head_dim") or head_dim)
        global_kv = int(full.get("num_key_value_heads") or kv_heads)
    else:  # a Hub config.json's keys (and transformers' defaults)
        global_dim = int(d.get("global_head_dim") or 512)
        global_kv = int((d.get("num_global_key_value_heads") if k_eq_v else None) or kv_heads)
    shared = int(d.get("num_kv_shared_layers") or 0)
    first_shared = layers - shared
    if shared and first_shared <= 0:
        raise ValueError("Gemma 4 with every layer KV-shared has no layer that computes K/V")
    sources = list(range(first_shared))
    for i in range(first_shared, layers):  # the last unshared layer of the same type
        producers = [j for j in range(first_shared) if sliding[j] == sliding[i]]
        if not producers:
            raise ValueError(f"Gemma 4 layer {i} shares K/V with no layer of its type")
        sources.append(producers[-1])
    params = d.get("rope_parameters") or _DEFAULT_ROPE
    experts = int(d.get("num_experts") or 0) if d.get("enable_moe_block") else 0
    extras = Gemma4Extras(
        sliding=sliding,
        global_head_dim=global_dim,
        global_kv_heads=global_kv,
        k_eq_v=k_eq_v,
        kv_sources=tuple(sources),
        first_shared=first_shared,
        per_layer_size=int(d.get("hidden_size_per_layer_input") or 0),
        per_layer_vocab=int(d.get("vocab_size_per_layer_input") or d["vocab_size"]),
        double_wide_mlp=bool(d.get("use_double_wide_mlp", False)),
        local_rope=_rope(params.get("sliding_attention") or {}, "sliding-window"),
        global_rope=_rope(params.get("full_attention") or {}, "full-attention"),
    )
    shapes = [(kv_heads, head_dim) if s else (global_kv, global_dim) for s in sliding]
    windows = tuple(window if s else 0 for s in sliding)
    return {
        "gemma4": extras,
        "windows": windows if any(windows) else (),
        "sliding_window": None,  # (Mistral's unapplied field: `windows` are applied)
        "kv_layers": first_shared,
        "kv_layer_shapes": tuple(shapes[:first_shared]),
        "local_rope_theta": extras.local_rope.theta,
        "rope_theta": extras.global_rope.theta,
        "embed_scale": d["hidden_size"] ** 0.5,
        "final_logit_softcap": float(d.get("final_logit_softcapping") or 0.0),
        "hidden_act": d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh",
        "tie_word_embeddings": d.get("tie_word_embeddings", True),
        "qk_norm": True,
        "num_experts": experts,
        "num_experts_per_tok": int(d.get("top_k_experts") or 0) if experts else 0,
        "moe_intermediate_size": int(d.get("moe_intermediate_size") or 0) if experts else 0,
        "norm_topk_prob": bool(experts),
    }
