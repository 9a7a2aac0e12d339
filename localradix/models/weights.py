"""Maps Hugging Face parameter names onto the fused parameters of `DecoderForCausalLM`.

q/k/v projections land in row slices of one `qkv_weight` (and `qkv_bias`), gate/up in one
`gate_up_weight`; Phi-3 checkpoints store both already fused (`qkv_proj`, `gate_up_proj`, in
the same row order), which load whole. Every expected parameter must be loaded exactly once
(checked at the end).

Experts (`moe.py`) are stacked into one [E, 2I, H] gate_up and one [E, H, I] down tensor per
layer. Checkpoints name them per expert, Mixtral's `block_sparse_moe.experts.N.w1/w3/w2` (gate,
up, down) and Qwen3-MoE's `mlp.experts.N.gate_proj/up_proj/down_proj` (what transformers 5
still saves), or already stacked, `experts.gate_up_proj` / `experts.down_proj` (transformers
5's in-memory names): all are read as the Qwen3-MoE per-expert names, which the stacked
tensors stand for in the coverage check. The router is `block_sparse_moe.gate` / `mlp.gate`.
Experts with biases (gpt-oss, whose model hands its tensors in these layouts) also load
`mlp.gate.bias` and the stacked `mlp.experts.gate_up_proj_bias` / `down_proj_bias`; its
attention `self_attn.o_proj.bias` and `self_attn.sinks`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from localradix.models.decoder import DecoderForCausalLM, DecoderLayer
    from localradix.models.moe import MoEBlock

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_MIXTRAL_MOE = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.")
_MIXTRAL_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
_STACKED = {  # stacked expert tensor -> the per-expert names it holds
    "mlp.experts.gate_up_proj": ("gate_proj", "up_proj"),
    "mlp.experts.down_proj": ("down_proj",),
}


def _canonical(name: str) -> str:
    """Mixtral's expert names as Qwen3-MoE's (`block_sparse_moe.experts.0.w1` -> `mlp...`)."""
    if _MIXTRAL_MOE.match(name) is None:
        return name
    name = _MIXTRAL_MOE.sub(r"\1mlp.", name, count=1)
    return re.sub(
        r"(\.experts\.\d+\.)(w[123])\.", lambda m: m[1] + _MIXTRAL_EXPERT[m[2]] + ".", name
    )


class WeightLoader:
    def __init__(self, model: DecoderForCausalLM) -> None:
        self.model = model
        self.loaded: set[str] = set()
        self.expected = set(self._targets_all())

    def load(self, name: str, tensor: torch.Tensor) -> None:
        if name.endswith(_IGNORED_SUFFIXES):
            return
        if not name.startswith(("model.", "lm_head.")):  # a bare model's (`Qwen3Model`) names
            name = "model." + name
        name = _canonical(name)
        if name == "lm_head.weight" and self.model.lm_head is None:
            return  # tied embeddings: transformers saves the same tensor twice at most
        target = self._target(name)
        if target.shape != tensor.shape:
            raise ValueError(
                f"{name}: checkpoint shape {tuple(tensor.shape)}, model {tuple(target.shape)}"
            )
        target.copy_(tensor)
        self.loaded.update(self._covered(name))

    def _covered(self, name: str) -> list[str]:
        """The expected names a loaded tensor stands for: itself, or each expert's part."""
        match = _LAYER.fullmatch(name)
        parts = _STACKED.get(match.group(2)) if match else None
        if match is None or parts is None:
            return [name]
        prefix = f"model.layers.{match.group(1)}.mlp.experts."
        experts = range(self.model.config.num_experts)
        return [f"{prefix}{e}.{part}.weight" for e in experts for part in parts]

    def check_complete(self) -> None:
        missing = sorted(self.expected - self.loaded)
        if missing:
            shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
            raise ValueError(f"checkpoint is missing {len(missing)} weights: {shown}")

    def _targets_all(self) -> list[str]:
        m = self.model
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        if m.lm_head is not None:
            names.append("lm_head.weight")
        per_layer = _FUSED_NAMES if m.config.fused_qkv_gate_up else _LAYER_NAMES
        for i, layer in enumerate(m.layers):
            p = f"model.layers.{i}."
            if layer.moe is None:
                names += [p + s for s in per_layer]
            else:
                names += [p + s for s in per_layer if not s.startswith("mlp.")]
                names.append(p + "mlp.gate.weight")
                parts = ("gate_proj", "up_proj", "down_proj")
                experts = range(m.config.num_experts)
                names += [f"{p}mlp.experts.{e}.{x}.weight" for e in experts for x in parts]
                if getattr(layer.moe, "router_bias", None) is not None:  # gpt-oss
                    names.append(p + "mlp.gate.bias")
                    names += [f"{p}mlp.experts.{x}_proj_bias" for x in ("gate_up", "down")]
            if layer.qkv_bias is not None:
                names += [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
            if layer.q_norm is not None:
                names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
            for suffix, attribute in _OPTIONAL_ATTENTION.items():  # gpt-oss
                if getattr(layer, attribute, None) is not None:
                    names.append(p + suffix)
            if getattr(layer, "pre_ff_norm", None) is not None:  # Gemma's four norms a layer
                names += [p + "pre_feedforward_layernorm.weight"]
                names += [p + "post_feedforward_layernorm.weight"]
        return names

    def _target(self, name: str) -> torch.Tensor:
        m = self.model
        top = {
            "model.embed_tokens.weight": m.embed_tokens,
            "model.norm.weight": m.norm,
            "lm_head.weight": m.lm_head,
        }
        if name in top:
            target = top[name]
            assert target is not None  # load() skips lm_head.weight when embeddings are tied
            return target
        match = _LAYER.fullmatch(name)
        if match is None or int(match.group(1)) >= len(m.layers):
            raise ValueError(f"unexpected weight {name!r}")
        return _layer_target(m, int(match.group(1)), match.group(2), name)


_LAYER_NAMES = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
_OPTIONAL_ATTENTION = {"self_attn.o_proj.bias": "o_bias", "self_attn.sinks": "sinks"}
_FUSED_NAMES = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.qkv_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_up_proj.weight",
    "mlp.down_proj.weight",
)


def _layer_target(model: DecoderForCausalLM, index: int, rest: str, name: str) -> torch.Tensor:
    layer = cast("DecoderLayer", model.layers[index])
    c = model.config
    qkv_rows = {
        "q": (0, c.q_size),
        "k": (c.q_size, c.kv_size),
        "v": (c.q_size + c.kv_size, c.kv_size),
    }
    direct = {
        "input_layernorm.weight": layer.input_norm,
        "post_attention_layernorm.weight": layer.post_norm,
        "self_attn.o_proj.weight": layer.o_weight,
        "self_attn.qkv_proj.weight": layer.qkv_weight,  # Phi-3: [q; k; v] rows, as ours
        "mlp.gate_up_proj.weight": layer.gate_up_weight,  # Phi-3: [gate; up] rows, as ours
        "self_attn.q_norm.weight": layer.q_norm,
        "self_attn.k_norm.weight": layer.k_norm,
        "mlp.down_proj.weight": layer.down_weight,
        "pre_feedforward_layernorm.weight": getattr(layer, "pre_ff_norm", None),
        "post_feedforward_layernorm.weight": getattr(layer, "post_ff_norm", None),
        **{suffix: getattr(layer, a, None) for suffix, a in _OPTIONAL_ATTENTION.items()},
    }
    if layer.moe is not None and rest.startswith("mlp."):
        return _expert_target(layer.moe, rest, name)
    target = direct.get(rest)
    if target is not None:
        return target
    size = c.intermediate_size
    gate_up = layer.gate_up_weight  # None only in MoE layers, which returned above
    if rest == "mlp.gate_proj.weight" and gate_up is not None:
        return gate_up[:size]
    if rest == "mlp.up_proj.weight" and gate_up is not None:
        return gate_up[size:]
    match = re.fullmatch(r"self_attn\.([qkv])_proj\.(weight|bias)", rest)
    fused = None if match is None else getattr(layer, f"qkv_{match.group(2)}")
    if match is None or fused is None:
        raise ValueError(f"unexpected weight {name!r}")
    start, length = qkv_rows[match.group(1)]
    return fused[start : start + length]


def _expert_target(moe: MoEBlock, rest: str, name: str) -> torch.Tensor:
    """A MoE layer's router and experts (names canonical: see `_canonical`)."""
    if rest == "mlp.gate.weight":
        return moe.router_weight
    if rest == "mlp.experts.gate_up_proj":  # [E, 2I, H]: gate rows, then up rows, as ours
        return moe.gate_up_weight
    if rest == "mlp.experts.down_proj":
        return moe.down_weight
    biases = {
        "mlp.gate.bias": moe.router_bias,
        "mlp.experts.gate_up_proj_bias": moe.gate_up_bias,  # [E, 2I]: gate, then up
        "mlp.experts.down_proj_bias": moe.down_bias,
    }
    bias = biases.get(rest)
    if bias is not None:
        return bias
    match = _EXPERT.fullmatch(rest)
    if match is None or int(match.group(1)) >= moe.num_experts:
        raise ValueError(f"unexpected weight {name!r}")
    expert, part = int(match.group(1)), match.group(2)
    size = moe.intermediate
    if part == "gate_proj":
        return moe.gate_up_weight[expert, :size]
    if part == "up_proj":
        return moe.gate_up_weight[expert, size:]
    return moe.down_weight[expert]
