"""The GGUF architectures the torch models implement, one `GGUFArch` entry each.

Each entry names the HF model type and class, and what llama.cpp's converter
(`convert_hf_to_gguf.py`) changed that loading must undo: Q/K rows permuted to interleaved
RoPE (llama, mistral, smollm3), +1 added to norm weights (gemma3, qwen35), tensors renamed,
fused (phi3) or split and transposed (gpt-oss experts), Qwen3.5's delta-net V heads reordered
and A_log stored as -exp(A_log) (`layouts`), and settings the converter leaves to llama.cpp's
per-architecture defaults (SmolLM3's every-4th NoPE layer, Gemma 3's 5-sliding-1-full pattern
and attention scale, gpt-oss's alternating windows) or stores as tensors (Phi-3's longrope
factors): `extra` writes those config keys. Mixtral is `llama` with `*_exps` tensors (`moe`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Get = Callable[..., Any]  # get(key, default=None): the `<arch>.<key>` metadata value
TensorValues = Callable[[str], np.ndarray]  # a GGUF tensor's values, by GGUF name
Build = Callable[[list[np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class Layout:
    """How a GGUF tensor (and `partner`, the same layer's tensor of that part) makes the HF
    tensor: `build` from their float32 values, `shape` from their shapes."""

    partner: str | None
    build: Build
    shape: Callable[[list[tuple[int, ...]]], tuple[int, ...]]


@dataclass(frozen=True)
class GGUFArch:
    model_type: str
    hf_arch: str
    permuted_qk: bool = False  # Q/K rows permuted by the converter (llama-style RoPE)
    norm_shift: float = 0.0  # the converter added this to every `*norm.weight`
    # GGUF layer tensor part -> HF suffix, where it differs from the llama names
    names: dict[str, str] = field(default_factory=dict)
    # config.json keys beyond the common ones: (get, tensor names, tensor values) -> dict
    extra: Callable[[Get, set[str], TensorValues | None], dict[str, Any]] | None = None
    moe: tuple[str, str] | None = None  # (model_type, architecture) when it has `*_exps`
    layouts: dict[str, Layout] = field(default_factory=dict)  # `part.kind` -> HF layout
    meta_layouts: Callable[[Get], dict[str, Layout]] | None = None  # ... that need metadata
    unshifted: tuple[str, ...] = ()  # HF names ending so that `norm_shift` skips


def experts_config(get: Get, names: set[str], values: TensorValues | None) -> dict[str, Any]:
    """llama.cpp's llama and qwen3moe graphs softmax the router and renormalise the top k."""
    return {
        "num_local_experts": get("expert_count"),
        "num_experts_per_tok": get("expert_used_count"),
        "moe_intermediate_size": get("expert_feed_forward_length") or get("feed_forward_length"),
        "norm_topk_prob": True,
    }


def _smollm3(get: Get, names: set[str], values: TensorValues | None) -> dict[str, Any]:
    return {"no_rope_layer_interval": 4}  # llama.cpp's fixed `n_no_rope_layer_step`


def _phi3(get: Get, names: set[str], values: TensorValues | None) -> dict[str, Any]:
    head_dim = get("embedding_length") // get("attention.head_count")
    config: dict[str, Any] = {
        "partial_rotary_factor": (get("rope.dimension_count") or head_dim) / head_dim,
        "sliding_window": get("attention.sliding_window") or None,
        "original_max_position_embeddings": get("rope.scaling.original_context_length"),
    }
    if "rope_factors_long.weight" in names:  # a longrope model (128k context)
        if values is None:
            raise ValueError("Phi-3 longrope factors need the GGUF's tensors")
        scaling = {
            "rope_type": "longrope",
            "long_factor": values("rope_factors_long.weight").tolist(),
            "short_factor": values("rope_factors_short.weight").tolist(),
            "original_max_position_embeddings": get("rope.scaling.original_context_length"),
        }
        if get("rope.scaling.attn_factor"):  # the converter's, as transformers derives it
            scaling["attention_factor"] = get("rope.scaling.attn_factor")
        config["rope_scaling"] = scaling
    return config


def _layer_types(get: Get, pattern: int) -> list[str]:
    """llama.cpp's sliding-window layers: `sliding_window_pattern` (per layer, or every n-th
    layer full) or the architecture's default n, as `llama_hparams::set_swa_pattern`."""
    layers, window = get("block_count"), get("attention.sliding_window") or 0
    pattern = get("attention.sliding_window_pattern", pattern)
    if isinstance(pattern, list):
        sliding = [bool(p) for p in pattern[:layers]]
    else:
        sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(layers)]
    return ["sliding_attention" if s and window else "full_attention" for s in sliding]


def _gpt_oss(get: Get, names: set[str], values: TensorValues | None) -> dict[str, Any]:
    """Alternate sliding (first) and full layers, YaRN (transformers' gpt-oss: untruncated)."""
    return {
        "layer_types": _layer_types(get, 2),
        "sliding_window": get("attention.sliding_window") or None,
        "attention_bias": True,
        "intermediate_size": get("expert_feed_forward_length"),
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": get("rope.scaling.factor"),
            "beta_fast": get("rope.scaling.yarn_beta_fast", 32.0),
            "beta_slow": get("rope.scaling.yarn_beta_slow", 1.0),
            "original_max_position_embeddings": get("rope.scaling.original_context_length"),
            "truncate": False,
        },
    }


def _interleave(arrays: list[np.ndarray]) -> np.ndarray:
    """gate [E, I, ...], up [E, I, ...] -> [E, 2I, ...] with gate and up rows alternating."""
    gate, up = arrays
    return np.stack([gate, up], axis=2).reshape(gate.shape[0], -1, *gate.shape[2:])


def _interleaved_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    (e, rows, *rest), _ = shapes
    return (e, 2 * rows, *rest)


def _swap_last(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:-2], shape[-1], shape[-2])


# gpt-oss checkpoints' expert layouts (what `models/gpt_oss.py` reads): gate_up [E, H, 2I] and
# its bias [E, 2I] with gate/up alternating, down [E, I, H]; the converter split and transposed.
_GPT_OSS_LAYOUTS = {
    "ffn_gate_exps.weight": Layout(
        "ffn_up_exps",
        lambda a: _interleave(a).transpose(0, 2, 1),
        lambda s: _swap_last(_interleaved_shape(s)),
    ),
    "ffn_gate_exps.bias": Layout("ffn_up_exps", _interleave, _interleaved_shape),
    "ffn_down_exps.weight": Layout(
        None, lambda a: a[0].transpose(0, 2, 1), lambda s: _swap_last(s[0])
    ),
}


def _qwen35(get: Get, names: set[str], values: TensorValues | None) -> dict[str, Any]:
    """Qwen3.5's delta-net sizes from the converter's `ssm.*` keys (text positions: its MRoPE
    sections rotate as plain RoPE)."""
    recurrent = get("attention.recurrent_layers")
    value_heads = get("ssm.time_step_rank")
    head_dim = get("attention.key_length")
    types = (
        None
        if recurrent is None
        else ["linear_attention" if r else "full_attention" for r in recurrent]
    )
    return {
        "layer_types": types,  # (else every `full_attention_interval`-th layer is full)
        "full_attention_interval": get("full_attention_interval", 4),
        "linear_conv_kernel_dim": get("ssm.conv_kernel"),
        "linear_key_head_dim": get("ssm.state_size"),
        "linear_num_key_heads": get("ssm.group_count"),
        "linear_num_value_heads": value_heads,
        "linear_value_head_dim": get("ssm.inner_size") // value_heads,
        "partial_rotary_factor": get("rope.dimension_count", head_dim) / head_dim,
    }


def _qwen35_layouts(get: Get) -> dict[str, Layout]:
    """The converter put the V heads of each delta-net tensor from grouped-by-K-head order
    into tiled order (`_LinearAttentionVReorderBase._reorder_v_heads`), stored A_log as
    -exp(A_log) and conv1d [C, 1, K] as [C, K]: undone here."""
    k_heads, v_heads = get("ssm.group_count"), get("ssm.time_step_rank")
    per_k, v_dim = v_heads // k_heads, get("ssm.inner_size") // v_heads
    qk_rows = 2 * k_heads * get("ssm.state_size")

    def grouped(a: np.ndarray, axis: int, dim: int) -> np.ndarray:
        """Tiled [per_k, K, dim] -> grouped [K, per_k, dim] along `axis`."""
        shape = a.shape
        a = a.reshape(*shape[:axis], per_k, k_heads, dim, *shape[axis + 1 :])
        return a.swapaxes(axis, axis + 1).reshape(shape)

    def rows(dim: int) -> Layout:
        return Layout(None, lambda a: grouped(a[0], 0, dim), lambda s: s[0])

    def qkv(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a[:qk_rows], grouped(a[qk_rows:], 0, v_dim)])

    return {
        "attn_qkv.weight": Layout(None, lambda a: qkv(a[0]), lambda s: s[0]),
        "attn_gate.weight": rows(v_dim),
        "ssm_alpha.weight": rows(1),
        "ssm_beta.weight": rows(1),
        "ssm_dt.bias": rows(1),
        "ssm_a.weight": Layout(None, lambda a: grouped(np.log(-a[0]), 0, 1), lambda s: s[0]),
        "ssm_conv1d.weight": Layout(
            None, lambda a: qkv(a[0])[:, None, :], lambda s: (s[0][0], 1, s[0][1])
        ),
        "ssm_out.weight": Layout(None, lambda a: grouped(a[0], 1, v_dim), lambda s: s[0]),
    }


def _gemma3(get: Get, names: set[str], values: TensorValues | None) -> dict[str, Any]:
    """llama.cpp's defaults where the converter writes nothing: 5 sliding + 1 full layer per 6
    (or `sliding_window_pattern`), and the attention scale by head size (27B: hidden / heads)."""
    layers, window = get("block_count"), get("attention.sliding_window") or 0
    scalar = get("attention.key_length")
    if layers == 62:  # llama.cpp's LLM_TYPE_27B
        scalar = get("embedding_length") // get("attention.head_count")
    return {
        "layer_types": _layer_types(get, 6),
        "sliding_window": window or None,
        "rope_local_base_freq": get("rope.freq_base_swa", 10000.0),
        "query_pre_attn_scalar": scalar,
        "final_logit_softcapping": get("final_logit_softcapping"),
        "hidden_activation": "gelu_pytorch_tanh",
    }


GGUF_ARCHITECTURES = {  # GGUF `general.architecture` -> its entry
    "llama": GGUFArch(
        "llama",
        "LlamaForCausalLM",
        permuted_qk=True,
        moe=("mixtral", "MixtralForCausalLM"),  # Mixtral converts to llama with `*_exps`
    ),
    "mistral": GGUFArch("mistral", "MistralForCausalLM", permuted_qk=True),
    "qwen2": GGUFArch("qwen2", "Qwen2ForCausalLM"),
    "qwen3": GGUFArch("qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": GGUFArch(
        "qwen3_moe", "Qwen3MoeForCausalLM", moe=("qwen3_moe", "Qwen3MoeForCausalLM")
    ),
    "phi3": GGUFArch(
        "phi3",
        "Phi3ForCausalLM",
        names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},  # fused
        extra=_phi3,
    ),
    "gpt-oss": GGUFArch(
        "gpt_oss",
        "GptOssForCausalLM",
        names={"post_attention_norm": "post_attention_layernorm", "attn_sinks": "self_attn.sinks"},
        extra=_gpt_oss,
        moe=("gpt_oss", "GptOssForCausalLM"),
        layouts=_GPT_OSS_LAYOUTS,
    ),
    "qwen35": GGUFArch(
        "qwen3_5_text",
        "Qwen3_5ForCausalLM",
        norm_shift=1.0,  # (1 + w) norms, but for the delta-nets' gated norm
        unshifted=("linear_attn.norm.weight",),
        names={
            "post_attention_norm": "post_attention_layernorm",
            "attn_qkv": "linear_attn.in_proj_qkv",
            "attn_gate": "linear_attn.in_proj_z",
            "ssm_alpha": "linear_attn.in_proj_a",
            "ssm_beta": "linear_attn.in_proj_b",
            "ssm_a": "linear_attn.A_log",
            "ssm_dt": "linear_attn.dt",
            "ssm_conv1d": "linear_attn.conv1d",
            "ssm_norm": "linear_attn.norm",
            "ssm_out": "linear_attn.out_proj",
        },
        extra=_qwen35,
        meta_layouts=_qwen35_layouts,
    ),
    "smollm3": GGUFArch("smollm3", "SmolLM3ForCausalLM", permuted_qk=True, extra=_smollm3),
    "gemma3": GGUFArch(
        "gemma3_text",
        "Gemma3ForCausalLM",
        norm_shift=1.0,  # Gemma3RMSNorm scales by (1 + w): the converter stored 1 + w
        names={
            "ffn_norm": "pre_feedforward_layernorm",
            "post_attention_norm": "post_attention_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
        extra=_gemma3,
    ),
}


def architecture_of(meta: dict[str, Any]) -> GGUFArch:
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        known = ", ".join(sorted(GGUF_ARCHITECTURES))
        raise ValueError(
            f"the torch backend does not implement GGUF architecture {arch!r} (it runs {known}): "
            "serve it with --backend llamacpp"
        )
    return GGUF_ARCHITECTURES[arch]
