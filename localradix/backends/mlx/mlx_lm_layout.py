"""Folders converted by mlx-lm, back to the Hugging Face names and forms the MLX models read.

mlx-lm saves its own modules' parameters. For Qwen3.5 / Qwen3.5-MoE and Gemma 4 (its VLM
wrappers) they sit under `language_model.model.` / `language_model.lm_head.` (Gemma 4's
`switch_glu` experts are read by gemma4_experts.py); and its conversion of Qwen3.5,
Qwen3.5-MoE and Qwen3-Next moves each delta-net conv1d weight to MLX's conv layout
[channels, kernel, 1] and stores the (1 + w) norms (decoder layers, final, q/k) as 1 + w. A
folder with such a conv weight was converted by it, so both are undone (1 + w - 1 is exact for
the weights these norms hold). Stacked `switch_mlp` experts are `weights.unstack_switch_mlp`'s.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

_WRAPPERS = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."))
_SHIFTED_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


def from_mlx_lm(
    raw: dict[str, mx.array], quantization: dict[str, Any] | None
) -> tuple[dict[str, mx.array], dict[str, Any] | None]:
    """(weights, the config's "quantization" block), named and shaped as Hugging Face's."""
    raw = {_unwrapped(name): w for name, w in raw.items()}
    if quantization is not None:  # its per-layer entries are named by module path too
        quantization = {_unwrapped(name): q for name, q in quantization.items()}
    if any(_in_mlx_conv_layout(name, w) for name, w in raw.items()):
        raw = {name: _as_hf(name, w) for name, w in raw.items()}
    return raw, quantization


def _unwrapped(name: str) -> str:
    for theirs, ours in _WRAPPERS:
        if name.startswith(theirs):
            return ours + name.removeprefix(theirs)
    return name


def _in_mlx_conv_layout(name: str, w: mx.array) -> bool:
    return name.endswith("conv1d.weight") and w.ndim == 3 and w.shape[2] == 1 < w.shape[1]


def _as_hf(name: str, w: mx.array) -> mx.array:
    if _in_mlx_conv_layout(name, w):
        return w.swapaxes(1, 2)  # [channels, kernel, 1] -> [channels, 1, kernel]
    if w.ndim == 1 and name.endswith(_SHIFTED_NORMS):
        return w.astype(mx.float32) - 1.0
    return w
