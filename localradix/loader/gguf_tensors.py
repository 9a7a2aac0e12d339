"""GGUF tensors -> Hugging Face parameters, with llama.cpp's converter's changes undone.

`tensor_plan` lists, per HF parameter the torch models load, the GGUF tensor(s) it comes from
and how: Q/K rows un-permuted where the converter permuted them to interleaved RoPE (as
transformers' GGUF integration does), the +1 the Gemma 3 / Qwen3.5 converters added to norm
weights subtracted, and each `Layout` applied: stacked experts (`ffn_{gate,up}_exps`,
[E, I, H]) joined into the models' [E, 2I, H] gate_up (gpt-oss: its own interleaved layouts),
Qwen3.5's delta-net tensors back in their checkpoint order. Names differing per architecture
come from its `GGUFArch.names`. Each entry dequantizes to float32 only when loaded.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from localradix.gguf_file import GGUFFile, GGUFTensor
from localradix.loader.gguf_arch import Build, GGUFArch, Layout, architecture_of

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
_EXPERT_NAMES = {  # stacked tensors: transformers 5's names, without `.weight` (`_BARE`)
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_up_proj",  # with ffn_up_exps (`Layout.partner`)
    "ffn_down_exps": "mlp.experts.down_proj",
}
_BARE = {"ffn_gate_exps", "ffn_down_exps", "attn_sinks", "ssm_a", "ssm_dt"}  # no `.weight`
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+?)(?:\.(weight|bias))?")  # (qwen35's `ssm_a`: bare)


def _gate_then_up(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays, axis=1)


def _gate_then_up_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    (e, rows, *rest), (_, more, *_) = shapes
    return (e, rows + more, *rest)


# `part.kind` -> its layout where it is not the tensor as stored
LAYOUTS = {"ffn_gate_exps.weight": Layout("ffn_up_exps", _gate_then_up, _gate_then_up_shape)}


@dataclass(frozen=True)
class HFTensor:
    """One HF parameter: its GGUF source tensors and how to make it from them."""

    name: str
    shape: tuple[int, ...]
    sources: tuple[GGUFTensor, ...]
    build: Build

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def qtype(self) -> int:
        """The sources' GGML type (F32's when they differ)."""
        types = {s.qtype for s in self.sources}
        return types.pop() if len(types) == 1 else 0

    def load(self) -> np.ndarray:
        """float32 values (a read-only view of the file for F32 tensors left as they are)."""
        return self.build([_dequantize(s) for s in self.sources])


def hf_tensor_name(name: str, arch: GGUFArch | None = None) -> str | None:
    """The HF parameter name of a GGUF tensor (None for tensors the models do not use). Without
    `arch`: the llama names (no experts)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _BLOCK.fullmatch(name)
    if match is None:
        return None
    layer, part, kind = match.group(1), match.group(2), match.group(3) or "weight"
    names = {**_LAYER_NAMES, **(_EXPERT_NAMES if arch and arch.moe else {})}
    hf = (arch.names if arch else {}).get(part) or names.get(part)
    if hf is None:
        return None
    if part in _BARE:
        return f"model.layers.{layer}.{hf}" + ("_bias" if kind == "bias" else "")
    return f"model.layers.{layer}.{hf}.{kind}"


def tensor_plan(gguf: GGUFFile) -> list[HFTensor]:
    """Every parameter the model loads from this GGUF, in file order."""
    meta = gguf.metadata
    arch = architecture_of(meta)
    by_name = {t.name: t for t in gguf.tensors}
    prefix = f"{meta['general.architecture']}."
    layouts = {**LAYOUTS, **arch.layouts}
    if arch.meta_layouts is not None:
        layouts.update(arch.meta_layouts(lambda key, default=None: meta.get(prefix + key, default)))
    plan = []
    for t in gguf.tensors:
        name = hf_tensor_name(t.name, arch)
        if name is None:
            continue
        sources: tuple[GGUFTensor, ...] = (t,)
        shape, steps = t.shape, list[Any]()
        block = _BLOCK.fullmatch(t.name)
        part, kind = (block.group(2), block.group(3) or "weight") if block else ("", "")
        layout = layouts.get(f"{part}.{kind}")
        if layout is None:
            steps.append(_first)
        else:
            if layout.partner is not None:
                sources = (t, by_name[t.name.replace(part, layout.partner)])
            shape = layout.shape([s.shape for s in sources])
            steps.append(layout.build)
        if arch.norm_shift and name.endswith("norm.weight") and not name.endswith(arch.unshifted):
            steps.append(_shifted(arch.norm_shift))
        heads = qk_heads(gguf.metadata, name)
        if heads is not None:
            steps.append(lambda a, h=heads: unpermute_qk(a, h))
        plan.append(HFTensor(name, tuple(shape), sources, _chain(steps)))
    return plan


def unpermute_qk(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> HF rotate-half halves)."""
    dim = weights.shape[0] // num_heads // 2
    w = weights.reshape(num_heads, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)


def qk_heads(meta: dict[str, Any], hf_name: str) -> int | None:
    """Heads to un-permute by, if `hf_name` is a permuted Q/K tensor of this file."""
    arch = meta["general.architecture"]
    if not architecture_of(meta).permuted_qk:
        return None
    if ".self_attn.q_proj." in hf_name:
        return meta[f"{arch}.attention.head_count"]
    if ".self_attn.k_proj." in hf_name:
        heads = meta[f"{arch}.attention.head_count"]
        return meta.get(f"{arch}.attention.head_count_kv") or heads
    return None


def _dequantize(tensor: GGUFTensor) -> np.ndarray:
    try:
        return tensor.dequantize()
    except NotImplementedError as e:  # a type gguf-py's numpy dequantiser lacks
        raise ValueError(
            f"the torch backend cannot dequantize GGUF tensor {tensor.name} ({e}): "
            "serve it with --backend llamacpp"
        ) from None


def _first(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0]


def _shifted(shift: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda a: a - np.float32(shift)


def _chain(steps: list[Any]) -> Build:
    """The first step takes the source arrays; each later one the previous result."""
    first, rest = steps[0], steps[1:]

    def build(arrays: list[np.ndarray]) -> np.ndarray:
        array = first(arrays)
        for step in rest:
            array = step(array)
        return array

    return build
