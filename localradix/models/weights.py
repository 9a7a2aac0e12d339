"""Maps Hugging Face parameter names onto the fused parameters of `DecoderForCausalLM`.

q/k/v projections land in row slices of one `qkv_weight` (and `qkv_bias`), gate/up in one
`gate_up_weight`; Phi-3 checkpoints store both already fused (`qkv_proj`, `gate_up_proj`, in
the same row order), which load whole. Every expected parameter must be loaded exactly once
(checked at the end).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from localradix.models.decoder import DecoderForCausalLM, DecoderLayer

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


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
        if name == "lm_head.weight" and self.model.lm_head is None:
            return  # tied embeddings: transformers saves the same tensor twice at most
        target = self._target(name)
        if target.shape != tensor.shape:
            raise ValueError(
                f"{name}: checkpoint shape {tuple(tensor.shape)}, model {tuple(target.shape)}"
            )
        target.copy_(tensor)
        self.loaded.add(name)

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
            names += [p + s for s in per_layer]
            if layer.qkv_bias is not None:
                names += [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
            if layer.q_norm is not None:
                names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
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
    }
    target = direct.get(rest)
    if target is not None:
        return target
    size = c.intermediate_size
    if rest == "mlp.gate_proj.weight":
        return layer.gate_up_weight[:size]
    if rest == "mlp.up_proj.weight":
        return layer.gate_up_weight[size:]
    match = re.fullmatch(r"self_attn\.([qkv])_proj\.(weight|bias)", rest)
    fused = None if match is None else getattr(layer, f"qkv_{match.group(2)}")
    if match is None or fused is None:
        raise ValueError(f"unexpected weight {name!r}")
    start, length = qkv_rows[match.group(1)]
    return fused[start : start + length]
