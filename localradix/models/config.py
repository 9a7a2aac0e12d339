"""ModelConfig: the typed, frozen subset of a Hugging Face config.json the models use.

Built from a config.json dict (`from_hf_dict`; both the transformers 4 `rope_theta` /
`rope_scaling` keys and the transformers 5 `rope_parameters` key are read) or from GGUF
metadata (see `localradix.loader.gguf`, which first writes an HF-style dict). Imports no torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

# HF `model_type` -> the `architectures` name used when a config lists none.
MODEL_TYPE_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. rope_type: "default", "linear", "llama3" or "longrope"."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3; longrope: where long factors start
    short_factor: tuple[float, ...] = ()  # longrope: per-frequency divisors below that length
    long_factor: tuple[float, ...] = ()  # longrope: ... and from it on
    attention_factor: float = 1.0  # longrope: multiplies cos and sin (resolved by from_hf_dict)

    @staticmethod
    def from_hf(params: dict[str, Any] | None) -> RopeScaling:
        if not params:
            return RopeScaling()
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "su":  # Phi-3's first name for longrope
            rope_type = "longrope"
        known = {f.name for f in dataclasses.fields(RopeScaling)} - {"rope_type"}
        values = {k: v for k, v in params.items() if k in known and v is not None}
        return RopeScaling(rope_type=rope_type, **_tuples(values))


def _tuples(values: dict[str, Any]) -> dict[str, Any]:
    """Lists (from JSON) as tuples, so the frozen configs stay hashable and compare equal."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def _longrope(scaling: RopeScaling, params: dict[str, Any], d: dict[str, Any]) -> RopeScaling:
    """What transformers' `_compute_longrope_parameters` derives: the pretraining length (a
    top-level key wins, as Phi-3 saves it there) and the cos/sin scale, from the length ratio
    unless the checkpoint gives `factor` or `attention_factor` itself."""
    original = int(
        d.get("original_max_position_embeddings")
        or params.get("original_max_position_embeddings")
        or d.get("max_position_embeddings", 2048)
    )
    factor = params.get("factor")
    if factor is None:
        factor = d.get("max_position_embeddings", 2048) / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return dataclasses.replace(
        scaling,
        factor=float(factor),
        original_max_position_embeddings=original,
        attention_factor=float(attention),
    )


def _rope_layers(d: dict[str, Any], model_type: str) -> tuple[bool, ...]:
    """SmolLM3's `no_rope_layers` (despite the name, 1 = this layer uses RoPE), else, as
    transformers derives it, every `no_rope_layer_interval`-th layer skips RoPE."""
    layers = d["num_hidden_layers"]
    flags = d.get("no_rope_layers")
    if flags is None and model_type == "smollm3":
        interval = d.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if flags is None or all(flags[:layers]):
        return ()
    return tuple(bool(f) for f in flags[:layers])


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None  # recorded, not applied (full attention everywhere)
    torch_dtype: str | None = None  # dtype the checkpoint was saved in
    kv_layers: int | None = None  # layers that keep KV, if not all (hybrids' recurrent ones don't)
    partial_rotary_factor: float = 1.0  # RoPE on this leading fraction of each head (Phi-4-mini)
    rope_layers: tuple[bool, ...] = ()  # per layer: applies RoPE? () = all do (SmolLM3 NoPE)
    fused_qkv_gate_up: bool = False  # checkpoint has qkv_proj / gate_up_proj, not parts (Phi-3)
    # Mixture of experts (Mixtral, Qwen3-MoE); num_experts == 0: every layer has a dense MLP
    num_experts: int = 0
    num_experts_per_tok: int = 0  # top-k experts per token
    moe_intermediate_size: int = 0  # each expert's MLP width (dense layers: intermediate_size)
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to 1
    mlp_only_layers: tuple[int, ...] = ()  # Qwen3-MoE: layers with a dense MLP ...
    decoder_sparse_step: int = 1  # ... and else only every step-th layer has experts
    # Gemma 3 (models/gemma3.py)
    windows: tuple[int, ...] = ()  # per layer: sliding window (0 = full attention); () = none
    local_rope_theta: float | None = None  # RoPE base of the windowed layers (no scaling)
    offset_norms: bool = False  # RMSNorms scale by (1 + weight), in float32
    embed_scale: float = 1.0  # embeddings are multiplied by this (in the model dtype)
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power, not D's
    final_logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap); 0 = none
    attn_logit_softcap: float = 0.0  # the same on attention scores (Gemma 2; not applied)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        """Leading dims of each head that RoPE rotates (transformers truncates the same way)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def uses_rope(self, layer: int) -> bool:
        return not self.rope_layers or self.rope_layers[layer]

    def layer_windows(self) -> tuple[int, ...]:
        """Each layer's sliding window (keys p - window < j <= p), 0 = none; () = no layer
        has one. Attention backends apply them (`AttentionBackend.from_model_config`)."""
        return self.windows if any(self.windows) else ()

    def uses_moe(self, layer: int) -> bool:
        """Whether `layer`'s MLP is a mixture of experts (transformers' Qwen3-MoE rule)."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    def extensions(self) -> list[str]:
        """What this model needs beyond the Llama/Mistral/Qwen decoder, for backends that
        implement only that one to refuse it by name."""
        found = {
            "partial RoPE": self.partial_rotary_factor != 1.0,
            "layers without RoPE": bool(self.rope_layers),
            "longrope RoPE scaling": self.rope_scaling.rope_type == "longrope",
            "fused qkv_proj / gate_up_proj weights": self.fused_qkv_gate_up,
            "mixture of experts": self.num_experts > 0,
            "sliding-window attention layers": bool(self.layer_windows()),
            "Gemma (1 + weight) norms and embedding scale": self.offset_norms,
            "logit soft-capping": bool(self.final_logit_softcap or self.attn_logit_softcap),
        }
        return [name for name, needed in found.items() if needed]

    @staticmethod
    def from_hf_dict(d: dict[str, Any]) -> ModelConfig:
        model_type = d.get("model_type", "llama")
        archs = d.get("architectures") or [MODEL_TYPE_ARCHITECTURES.get(model_type, "")]
        heads = d["num_attention_heads"]
        rope = d.get("rope_parameters") or {}
        rope_theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling") or rope
        rope_scaling = RopeScaling.from_hf(scaling)
        if model_type == "phi3" and rope_scaling.rope_type == "yarn":
            rope_scaling = dataclasses.replace(rope_scaling, rope_type="longrope")  # as HF does
        if rope_scaling.rope_type == "longrope":
            rope_scaling = _longrope(rope_scaling, scaling, d)
        partial = scaling.get("partial_rotary_factor") or d.get("partial_rotary_factor") or 1.0
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        window = d.get("sliding_window") if d.get("use_sliding_window", True) else None
        # transformers 4 Qwen3-MoE says num_experts; Mixtral and transformers 5 num_local_experts
        experts = int(d.get("num_local_experts") or d.get("num_experts") or 0)
        config = ModelConfig(
            architecture=archs[0],
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=model_type == "qwen2" or bool(d.get("attention_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            hidden_act=d.get("hidden_act", "silu"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            sliding_window=window,
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "") or None,
            partial_rotary_factor=float(partial),
            rope_layers=_rope_layers(d, model_type),
            fused_qkv_gate_up=model_type == "phi3",
            num_experts=experts,
            num_experts_per_tok=(
                int(d.get("num_experts_per_tok") or (8 if model_type == "qwen3_moe" else 2))
                if experts
                else 0
            ),  # (defaults: transformers')
            moe_intermediate_size=(
                int(d.get("moe_intermediate_size") or d["intermediate_size"]) if experts else 0
            ),
            # Mixtral's router always renormalises its top-k; Qwen3-MoE's when configured to
            norm_topk_prob=model_type == "mixtral" or bool(d.get("norm_topk_prob", False)),
            mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
            decoder_sparse_step=int(d.get("decoder_sparse_step") or 1),
        )
        return _gemma3(config, d) if model_type == "gemma3_text" else config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ModelConfig:
        """Inverse of `to_dict` (used by the GGUF conversion cache)."""
        values = dict(d)
        values["rope_scaling"] = RopeScaling(**_tuples(values.get("rope_scaling", {})))
        values["eos_token_ids"] = tuple(values.get("eos_token_ids", ()))
        values["rope_layers"] = tuple(values.get("rope_layers", ()))
        values["mlp_only_layers"] = tuple(values.get("mlp_only_layers", ()))
        values["windows"] = tuple(values.get("windows", ()))
        return ModelConfig(**values)


def _gemma3(config: ModelConfig, d: dict[str, Any]) -> ModelConfig:
    """Gemma 3's text model, as transformers' `Gemma3TextConfig` reads its config.json:
    per-layer attention types (`layer_types`, or every `sliding_window_pattern`-th layer
    full), a local RoPE for the windowed layers and the global one (with its scaling) for the
    others, both given per layer type in transformers 5's `rope_parameters`, or as
    `rope_local_base_freq` / `rope_theta` / `rope_scaling` before."""
    if d.get("use_bidirectional_attention"):
        raise ValueError(
            "Gemma 3 with bidirectional attention (an embedding model) is not a decoder"
        )
    layers = config.num_hidden_layers
    types = d.get("layer_types")
    if types is None:
        pattern = int(d.get("sliding_window_pattern") or 6)
        types = [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
    window = int(d.get("sliding_window") or 0)
    windows = tuple(window if t == "sliding_attention" else 0 for t in types[:layers])
    params = d.get("rope_parameters") or {}
    nested = isinstance(params.get("full_attention"), dict)
    full = (params.get("full_attention") or {}) if nested else params
    local = (params.get("sliding_attention") or {}) if nested else {}
    local_scaling = RopeScaling.from_hf(local)
    if local_scaling.rope_type != "default":
        raise ValueError(f"Gemma 3 local RoPE scaling {local_scaling.rope_type!r} is not supported")
    hidden = config.hidden_size
    return dataclasses.replace(
        config,
        windows=windows if any(windows) else (),
        sliding_window=None,  # (that field is Mistral's unapplied one: `windows` are applied)
        rope_theta=float(full.get("rope_theta", d.get("rope_theta", 1_000_000.0))),
        rope_scaling=RopeScaling.from_hf(d.get("rope_scaling") or full),
        local_rope_theta=float(local.get("rope_theta", d.get("rope_local_base_freq", 10_000.0))),
        offset_norms=True,
        embed_scale=hidden**0.5,
        query_pre_attn_scalar=float(d.get("query_pre_attn_scalar") or 256),
        final_logit_softcap=float(d.get("final_logit_softcapping") or 0.0),
        attn_logit_softcap=float(d.get("attn_logit_softcapping") or 0.0),
        hidden_act=d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh",
        tie_word_embeddings=d.get("tie_word_embeddings", True),
        qk_norm=True,
    )
