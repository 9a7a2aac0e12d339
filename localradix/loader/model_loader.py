"""load_model / load_model_config: a ModelSource to a ready torch model and its ModelConfig.

`load_model_config` imports no torch; `load_model` does.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from localradix.loader.embedding import is_bare_model
from localradix.loader.hf import read_config
from localradix.models.config import ModelConfig
from localradix.models.registry import get_model_class
from localradix.store.source import ModelSource, resolve_model

if TYPE_CHECKING:
    import numpy as np
    import torch

    from localradix.model_api.tp_comm import TPComm

logger = logging.getLogger("localradix.loader")


def load_model_config(source: ModelSource | str | None) -> ModelConfig:
    """The model's config only (for GGUF: from its metadata, any architecture; no weights)."""
    source = _as_source(source)
    if source.kind == "hf":
        return ModelConfig.from_hf_dict(read_config(source.path))
    from localradix.gguf_file import read_gguf
    from localradix.loader.gguf_config import gguf_model_config

    return gguf_model_config(read_gguf(source.path, tensors=False).metadata)


def load_model(
    source: ModelSource | str | None,
    dtype: str | torch.dtype = "auto",
    device: torch.device | str = "cpu",
    max_positions: int | None = None,
    tp: TPComm | None = None,
) -> tuple[torch.nn.Module, ModelConfig]:
    """Build the model for `source` on `device` and load its weights (GGUF: via the cache).

    `max_positions` bounds the RoPE table (default: the config's max_position_embeddings).
    With `tp` of several ranks, only this rank's slice is built and read (safetensors only).
    The config returned is the full model's.
    """
    from localradix.loader.dtype import resolve_dtype

    source = _as_source(source)
    if tp is not None and tp.size > 1 and source.kind != "hf":
        raise ValueError(
            f"--tp {tp.size} loads Hugging Face safetensors folders, not GGUF files: give the "
            "model's folder (or serve the GGUF with --tp 1)"
        )
    folder, weights = _folder_and_weights(source)
    config = ModelConfig.from_hf_dict(read_config(folder))
    if source.kind == "hf" and is_bare_model(folder):  # an embedding model: no head to load
        config = dataclasses.replace(config, tie_word_embeddings=True)
    window = config.sliding_window
    if window is not None and window < (max_positions or config.max_position_embeddings):
        logger.warning(
            "%s uses sliding-window attention (%d tokens), which is not applied: "
            "outputs past that length differ from the reference",
            source.name,
            window,
        )
    model_class = get_model_class(config.architecture)
    extra: dict[str, TPComm] = {}
    if tp is not None and tp.size > 1:
        weights = _shard_weights(folder, config, tp)
        extra["tp"] = tp
    model = model_class(config, resolve_dtype(dtype, device), device, max_positions, **extra)
    model.load_weights(weights)
    return model.eval(), config


def _folder_and_weights(source: ModelSource) -> tuple[Path, Iterator[tuple[str, torch.Tensor]]]:
    """The folder with config.json, and the weights: from the folder, or straight from a GGUF."""
    from localradix.loader import gguf_convert as gc
    from localradix.loader.hf import iter_weights

    if source.kind == "hf":
        return source.path, iter_weights(source.path)
    if gc.needs_converted_copy(source.path):
        folder = gc.ensure_gguf_model(source.path)
        return folder, iter_weights(folder)
    return gc.ensure_gguf_tokenizer(source.path), _from_numpy(gc.iter_gguf_weights(source.path))


def _shard_weights(
    folder: Path, config: ModelConfig, tp: TPComm
) -> Iterator[tuple[str, torch.Tensor]]:
    from localradix.loader.shard_weights import iter_weight_shards
    from localradix.model_api.shard import Shard

    shard = Shard(tp.rank, tp.size)
    shard.check(config)
    return iter_weight_shards(folder, config, shard)


def _from_numpy(
    weights: Iterator[tuple[str, np.ndarray]],
) -> Iterator[tuple[str, torch.Tensor]]:
    import torch

    for name, array in weights:
        yield name, torch.from_numpy(array)


def _as_source(source: ModelSource | str | None) -> ModelSource:
    return source if isinstance(source, ModelSource) else resolve_model(source)
