"""A tensor-parallel rank's slice of a safetensors checkpoint, read slice by slice.

Each tensor is read through safetensors' lazy slices, so a rank reads (and holds) only its
rows or columns (`model_api/shard.py` says which), never the full model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from localradix.loader.hf import _safetensors_files
from localradix.model_api.shard import Shard
from localradix.models.config import ModelConfig


def iter_weight_shards(
    folder: Path, config: ModelConfig, shard: Shard
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, this rank's slice) for every tensor of the folder's safetensors files."""
    from safetensors import safe_open

    files = _safetensors_files(Path(folder))
    if not files:
        raise FileNotFoundError(f"--tp {shard.size} reads safetensors weights; {folder} has none")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                piece = shard.weight_slice(name, config)
                if piece is None:
                    yield name, f.get_tensor(name)
                    continue
                lazy = f.get_slice(name)
                part = (
                    lazy[piece.start : piece.stop]
                    if piece.dim == 0
                    else lazy[:, piece.start : piece.stop]
                )
                yield name, _padded(part, piece.rows)


def _padded(t: torch.Tensor, rows: int | None) -> torch.Tensor:
    """`t` with zero rows appended up to `rows` (the last vocab shard)."""
    if rows is None or t.shape[0] == rows:
        return t
    out = t.new_zeros(rows, *t.shape[1:])
    out[: t.shape[0]] = t
    return out
