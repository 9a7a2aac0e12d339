"""Hugging Face folders: config.json and the weights (safetensors, or torch .bin as a fallback)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def read_config(folder: Path) -> dict[str, Any]:
    with open(Path(folder) / "config.json", encoding="utf-8") as f:
        return json.load(f)


def iter_weights(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in the folder's checkpoint files (memory-mapped)."""
    from safetensors import safe_open

    folder = Path(folder)
    files = _safetensors_files(folder)
    if files:
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        return
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"{folder} holds no *.safetensors or pytorch_model*.bin weights")
    import torch

    for path in bins:
        yield from torch.load(path, map_location="cpu", weights_only=True, mmap=True).items()


def _safetensors_files(folder: Path) -> list[Path]:
    """The shards a `model.safetensors.index.json` lists, else every *.safetensors file."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [folder / s for s in shards]
    return sorted(folder.glob("*.safetensors"))
