"""Weights for the MLX models: Hugging Face / MLX-format safetensors folders, and GGUF files.

Safetensors are read with `mx.load` (which handles bfloat16, unlike numpy). A folder written by
mlx-lm carries its quantization in config.json ("quantization": group_size, bits, mode, and
per-layer overrides keyed by module path); a layer is quantized when `<path>.scales` exists,
and its weight/scales/biases are kept as they are. mlx-lm's MoE folders stack each layer's
experts (`switch_mlp`, float or quantized); they are read as per-expert slices, which the MoE
block stacks again. A GGUF is read directly, keeping the block types MLX can hold quantized
(gguf_weights.py); only its config and tokenizer go through the loader's cache. `--quantize N`
quantizes the remaining float matrices at load, as mlx-lm's convert does. No torch on this
path.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import mlx.core as mx

from localradix.backends.mlx.mlx_lm_layout import from_mlx_lm
from localradix.backends.mlx.quant import Quantized, QuantSpec, quantize
from localradix.loader.embedding import is_bare_model
from localradix.loader.hf import read_config
from localradix.models.config import ModelConfig
from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.runner")

Weight = mx.array | Quantized
_SWITCH_MLP = re.compile(r"(.+)\.switch_mlp\.(gate_proj|up_proj|down_proj)\.weight")


def load_weights(
    source: ModelSource, quantize_to: str = "auto"
) -> tuple[ModelConfig, dict[str, Weight]]:
    """(config, {HF parameter name: float array in the checkpoint's dtype, or Quantized}).

    quantize_to: "auto" / "off" keep float matrices float; "4", "8", "mxfp4", ... quantize them.
    """
    if source.kind == "gguf":
        from localradix.backends.mlx.gguf_weights import load_gguf_weights
        from localradix.loader.gguf_convert import ensure_gguf_tokenizer

        hf = read_config(ensure_gguf_tokenizer(Path(source.path)))
        weights = load_gguf_weights(Path(source.path), quantize_to)
    else:
        folder = Path(source.path)
        hf = read_config(folder)
        raw: dict[str, mx.array] = {}
        for path in safetensors_files(folder):
            loaded = mx.load(str(path))
            assert isinstance(loaded, dict)
            raw.update(loaded)
        raw, quantization = from_mlx_lm(raw, hf.get("quantization"))
        weights = group_quantized(_with_model_prefix(raw), quantization)
        weights = unstack_switch_mlp(weights)
        # An embedding model has no head (under any name): its logits use the embeddings.
        if "lm_head.weight" not in weights and is_bare_model(folder):
            hf = {**hf, "tie_word_embeddings": True}
    if quantize_to not in ("auto", "off"):
        weights = quantize_floats(weights, QuantSpec.parse(quantize_to))
    return ModelConfig.from_hf_dict(hf), weights


def _with_model_prefix(raw: dict[str, mx.array]) -> dict[str, mx.array]:
    """A bare model's names (`Qwen3Model`: `layers.0...`) as a causal LM's (`model.layers.0...`)."""
    return {k if k.startswith(("model.", "lm_head.")) else f"model.{k}": v for k, v in raw.items()}


def group_quantized(
    raw: dict[str, mx.array], quantization: dict[str, Any] | None
) -> dict[str, Weight]:
    """Each `<path>.weight/.scales[/.biases]` triple as one Quantized under `<path>.weight`."""
    quantized = [n.removesuffix(".scales") for n in raw if n.endswith(".scales")]
    if not quantized:
        return dict(raw)
    if not quantization:
        raise ValueError(
            f"{quantized[0]} is quantized (it has scales) but config.json has no "
            '"quantization" entry saying how (group_size, bits)'
        )
    default = QuantSpec.from_dict(quantization)
    out: dict[str, Weight] = dict(raw)
    for path in quantized:
        override = quantization.get(path)
        if override is False:
            raise ValueError(f"{path} has scales, but config.json says it is not quantized")
        spec = QuantSpec.from_dict(override) if isinstance(override, dict) else default
        weight = out.pop(path + ".weight", None)
        if not isinstance(weight, mx.array):
            raise ValueError(f"checkpoint has {path}.scales but no {path}.weight")
        scales, biases = out.pop(path + ".scales"), out.pop(path + ".biases", None)
        assert isinstance(scales, mx.array) and not isinstance(biases, Quantized)
        out[path + ".weight"] = Quantized(weight, scales, biases, spec, mx.float32)
    return out


def unstack_switch_mlp(weights: dict[str, Weight]) -> dict[str, Weight]:
    """mlx-lm's stacked experts (`<moe>.switch_mlp.<proj>.weight` [E, out, in], float or
    quantized along `in`) as one `<moe>.experts.<e>.<proj>.weight` per expert: slices of the
    stacked arrays, which the MoE block stacks again (fusing gate and up) as it loads them."""
    out: dict[str, Weight] = {}
    for name, w in weights.items():
        found = _SWITCH_MLP.fullmatch(name)
        if found is None:
            out[name] = w
            continue
        moe, proj = found[1], found[2]
        stacked = w.weight if isinstance(w, Quantized) else w
        if stacked.ndim != 3:
            raise ValueError(f"{name}: stacked experts are [experts, out, in], not {stacked.shape}")
        for e in range(stacked.shape[0]):
            out[f"{moe}.experts.{e}.{proj}.weight"] = _expert(w, e)
    return out


def _expert(w: Weight, e: int) -> Weight:
    """Expert `e` of a stacked weight (for quantized ones: of each of its arrays)."""
    if not isinstance(w, Quantized):
        return w[e]
    biases = None if w.biases is None else w.biases[e]
    return Quantized(w.weight[e], w.scales[e], biases, w.spec, w.dtype)


def quantize_floats(weights: dict[str, Weight], spec: QuantSpec) -> dict[str, Weight]:
    """Every float matrix (linear layers, embeddings) whose rows split into whole groups,
    quantized to `spec` one at a time (so only one float copy is alive at once)."""
    out: dict[str, Weight] = {}
    skipped = []
    for name, w in weights.items():
        if isinstance(w, Quantized) or w.ndim != 2:
            out[name] = w
        elif w.shape[1] % spec.group_size:
            out[name] = w
            skipped.append(name)
        else:
            out[name] = q = quantize(w, spec, w.dtype)
            mx.eval(q.arrays())
    if skipped:
        logger.info(
            "--quantize: %d matrices stay float (rows not a multiple of %d): %s",
            len(skipped),
            spec.group_size,
            ", ".join(skipped[:4]),
        )
    return out


def safetensors_files(folder: Path) -> list[Path]:
    """The shards a `model.safetensors.index.json` lists, else every *.safetensors file."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{folder} holds no *.safetensors weights; the MLX backend reads safetensors "
            "(convert pytorch_model*.bin with transformers' save_pretrained)"
        )
    return files
