"""Weights for the MLX models: Hugging Face safetensors folders, and GGUF via the loader's cache.

A GGUF is converted once (dequantized, Q/K un-permuted) by `loader.gguf_convert` into a cached
Hugging Face-style folder, which is numpy-only; both kinds are then read with `mx.load`
(which handles bfloat16, unlike numpy). No torch on this path.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx

from localradix.loader.hf import read_config
from localradix.loader.source import ModelSource
from localradix.models.config import ModelConfig


def model_folder(source: ModelSource) -> Path:
    """The Hugging Face-style folder holding config.json and *.safetensors for `source`."""
    if source.kind == "hf":
        return Path(source.path)
    from localradix.loader.gguf_convert import ensure_gguf_model

    return ensure_gguf_model(Path(source.path))


def load_weights(source: ModelSource) -> tuple[ModelConfig, dict[str, mx.array]]:
    """(config, {HF parameter name: array in the checkpoint's dtype})."""
    folder = model_folder(source)
    config = ModelConfig.from_hf_dict(read_config(folder))
    weights: dict[str, mx.array] = {}
    for path in safetensors_files(folder):
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        weights.update(loaded)
    return config, weights


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
