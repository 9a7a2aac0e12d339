"""ModelConfig: the typed, frozen subset of a Hugging Face config.json the models use.

Built from a config.json dict (`from_hf_dict`; both the transformers 4 `rope_theta` /
`rope_scaling` keys and the transformers 5 `rope_parameters` key are read) or from GGUF
metadata (see `localradix.loader.gguf`, which first writes an HF-style dict). Imports no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from localradix.models.gemma4_config import Gemma4Extras, gemma4_fields
from localradix.models.rope_scaling import (
    RopeScaling,
    json_tuples,
    longrope_scaling,
    yarn_scaling,
)

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
    "gemma4_text": "Gemma4ForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}


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
    # Qwen3.5 hybrids (models/qwen3_5.py): gated delta-net linear attention beside full attention
    linear_layers: tuple[bool, ...] = ()  # per layer: a gated delta-net? () = none
    linear_conv_kernel: int = 0  # its causal depthwise conv's width
    linear_key_heads: int = 0  # q/k heads (each serves value_heads / key_heads value heads)
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    attn_output_gate: bool = False  # full attention's q_proj also gives a sigmoid output gate
    shared_expert_size: int = 0  # Qwen3.5-MoE: a gated SwiGLU beside the experts (0 = none)
    # gpt-oss (models/gpt_oss.py)
    attention_sinks: bool = False  # a learned logit per head joins every softmax denominator
    swiglu_limit: float = 0.0  # experts clamp gate (above) and up (both sides); 0 = plain SwiGLU
    swiglu_alpha: float = 1.0  # ... then (up + 1) * gate * sigmoid(alpha * gate)
    # Gemma 4 (models/gemma4.py, gemma4_config.py): each KV layer's (kv_heads, head_dim), () =
    # all (num_key_value_heads, head_dim); the rest of what it needs
    kv_layer_shapes: tuple[tuple[int, int], ...] = ()
    gemma4: Gemma4Extras | None = None

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
        """Each KV layer's sliding window (keys p - window < j <= p), 0 = none; () = no layer
        has one. Attention backends apply them (`AttentionBackend.from_model_config`)."""
        return self.windows[: self.kv_layers] if any(self.windows) else ()

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
            "gated delta-net linear attention layers": any(self.linear_layers),
            "YaRN RoPE scaling": self.rope_scaling.rope_type == "yarn",
            "attention sinks": self.attention_sinks,
            "clamped SwiGLU experts with biases (gpt-oss)": bool(self.swiglu_limit),
            "Gemma 4 per-layer head sizes, shared KV and inputs": self.gemma4 is not None,
        }
        return [name for name, needed in found.items() if needed]

    @staticmethod
    def from_hf_dict(d: dict[str, Any]) -> ModelConfig:
        d = _text_model(d)
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
            rope_scaling = longrope_scaling(rope_scaling, scaling, d)
        if rope_scaling.rope_type == "yarn":
            rope_scaling = yarn_scaling(rope_scaling, scaling, d)
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
            intermediate_size=d.get("intermediate_size") or 0,  # (Qwen3.5-MoE: none)
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
        if model_type == "gpt_oss":
            return _gpt_oss(config, d)
        if model_type in ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"):
            return _qwen3_5(config, d)
        if model_type == "gemma4_text":
            fields = gemma4_fields(
                d, config.num_hidden_layers, config.num_key_value_heads, config.head_dim
            )
            return dataclasses.replace(config, **fields)
        return _gemma3(config, d) if model_type == "gemma3_text" else config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ModelConfig:
        """Inverse of `to_dict` (used by the GGUF conversion cache)."""
        values = dict(d)
        values["rope_scaling"] = RopeScaling(**json_tuples(values.get("rope_scaling", {})))
        values["eos_token_ids"] = tuple(values.get("eos_token_ids", ()))
        values["rope_layers"] = tuple(values.get("rope_layers", ()))
        values["mlp_only_layers"] = tuple(values.get("mlp_only_layers", ()))
        values["windows"] = tuple(values.get("windows", ()))
        values["linear_layers"] = tuple(values.get("linear_layers", ()))
        values["kv_layer_shapes"] = tuple(tuple(s) for s in values.get("kv_layer_shapes", ()))
        values["gemma4"] = Gemma4Extras.from_dict(values.get("gemma4"))
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


def _gpt_oss(config: ModelConfig, d: dict[str, Any]) -> ModelConfig:
    """gpt-oss, as transformers' `GptOssConfig` reads its config.json: alternating sliding-window
    and full layers (`layer_types`, else sliding first), q/k/v/o biases, attention sinks, YaRN
    RoPE (its defaults when the config gives none), experts on every layer (top-k of 4 by
    default) with a clamped SwiGLU."""
    layers = config.num_hidden_layers
    types = d.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)
    ]
    window = int(d.get("sliding_window") or 0)
    windows = tuple(window if t == "sliding_attention" else 0 for t in types[:layers])
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    scaling = config.rope_scaling
    if not rope:  # no RoPE given: transformers' default YaRN
        scaling = yarn_scaling(RopeScaling.from_hf(_GPT_OSS_YARN), _GPT_OSS_YARN, d)
    theta = rope.get("rope_theta", d.get("rope_theta", 150000.0))
    return dataclasses.replace(
        config,
        windows=windows if any(windows) else (),
        sliding_window=None,  # (Mistral's unapplied field: `windows` are applied)
        rope_theta=float(theta),
        rope_scaling=scaling,
        attention_bias=bool(d.get("attention_bias", True)),
        attention_sinks=True,
        num_experts_per_tok=int(d.get("num_experts_per_tok") or 4),
        norm_topk_prob=False,  # (its router takes a softmax over the top-k logits instead)
        swiglu_limit=float(d.get("swiglu_limit", 7.0)),
        swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
    )


_GPT_OSS_YARN = {  # transformers' GptOssConfig default RoPE
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


_MULTIMODAL = {  # model_type -> architecture of checkpoints whose text model is served alone
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "gemma4": "Gemma4ForConditionalGeneration",
}


def _text_model(d: dict[str, Any]) -> dict[str, Any]:
    """A multimodal Qwen3.5 or Gemma 4 checkpoint's `text_config` (its towers are not loaded), under
    the checkpoint's architecture; any other config as it is."""
    text = d.get("text_config")
    if d.get("model_type") not in _MULTIMODAL or not isinstance(text, dict):
        return d
    return {
        **text,
        "architectures": d.get("architectures") or [_MULTIMODAL[d["model_type"]]],
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", text.get("tie_word_embeddings"))),
        "eos_token_id": text.get("eos_token_id", d.get("eos_token_id")),
    }


def _qwen3_5(config: ModelConfig, d: dict[str, Any]) -> ModelConfig:
    """Qwen3.5's text model, as transformers' `Qwen3_5TextConfig` reads its config.json:
    per-layer `layer_types` (else every `full_attention_interval`-th layer full attention, the
    others gated delta-nets), the delta-nets' sizes, RoPE on a quarter of each head unless
    `partial_rotary_factor` says otherwise, zero-centred (1 + w) norms, full attention with q/k
    norm and an output gate. Only full-attention layers keep KV (`kv_layers`). Qwen3.5-MoE
    (`Qwen3_5MoeTextConfig`): experts on every layer (their top-k weights renormalised) beside
    a shared expert, and no dense MLP. Qwen3-Next (`Qwen3NextConfig`): the same blocks, its
    experts where Qwen3-MoE's rule puts them (dense MLPs elsewhere), `norm_topk_prob`."""
    layers = config.num_hidden_layers
    types = d.get("layer_types")
    if types is None:
        interval = int(d.get("full_attention_interval") or 4)
        types = [
            "linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)
        ]
    linear = tuple(t == "linear_attention" for t in types[:layers])
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    partial = rope.get("partial_rotary_factor") or d.get("partial_rotary_factor") or 0.25
    moe, next_ = config.num_experts > 0, config.model_type == "qwen3_next"
    shared = int(d.get("shared_expert_intermediate_size") or 0) if moe else 0
    top_k = int(d.get("num_experts_per_tok") or (10 if next_ else 8)) if moe else 0
    return dataclasses.replace(
        config,
        intermediate_size=int(d.get("intermediate_size") or shared),
        shared_expert_size=shared,
        num_experts_per_tok=top_k,
        norm_topk_prob=moe and bool(d.get("norm_topk_prob", True) if next_ else True),
        linear_layers=linear if any(linear) else (),
        kv_layers=max(layers - sum(linear), 1),
        linear_conv_kernel=int(d.get("linear_conv_kernel_dim") or 4),
        linear_key_heads=int(d.get("linear_num_key_heads") or 16),
        linear_value_heads=int(d.get("linear_num_value_heads") or 32),
        linear_key_head_dim=int(d.get("linear_key_head_dim") or 128),
        linear_value_head_dim=int(d.get("linear_value_head_dim") or 128),
        attn_output_gate=True,
        partial_rotary_factor=float(partial),
        qk_norm=True,
        offset_norms=True,
        sliding_window=None,
    )
