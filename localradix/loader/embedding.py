"""Whether a Hugging Face model folder is an embedding model, and how it pools.

An embedding model is a bare decoder (`architectures` naming `Qwen3Model`, `LlamaModel`, ...,
or untied weights without an `lm_head`), or a sentence-transformers folder: `modules.json`
with a Pooling module (`1_Pooling/config.json`: `pooling_mode_lasttoken` -> "last",
`pooling_mode_mean_tokens` -> "mean") and maybe a Normalize module. Without
sentence-transformers metadata it pools like Qwen3-Embedding: last token, L2-normalised.
GGUF models are not inspected (their `<arch>.pooling_type` is not read): they do not embed.
Imports no torch.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localradix.loader.hf import read_config, weight_names
from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.loader")

BARE_ARCHITECTURES = ("LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model")
_POOLING_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean"}
_ST = "sentence_transformers.models."


@dataclass(frozen=True)
class EmbeddingHead:
    pooling: str  # "last" | "mean"
    normalize: bool  # L2-normalise the pooled vector


def embedding_head(source: ModelSource) -> EmbeddingHead | None:
    """How the model embeds, or None for a model that only generates (or a GGUF)."""
    if source.kind != "hf":
        return None
    folder = source.path
    modules = _modules(folder)
    pooling = next((m for m in modules if m.get("type") == _ST + "Pooling"), None)
    if pooling is not None:
        normalize = any(m.get("type") == _ST + "Normalize" for m in modules)
        return _st_head(folder / str(pooling.get("path", "1_Pooling")), normalize)
    return EmbeddingHead("last", True) if is_bare_model(folder) else None


def is_bare_model(folder: Path) -> bool:
    """A decoder without a language-model head: its config names the bare model, or its
    weights are untied and have no `lm_head`."""
    config = read_config(folder)
    archs = config.get("architectures") or []
    if archs and archs[0] in BARE_ARCHITECTURES:
        return True
    if config.get("tie_word_embeddings", False):
        return False
    try:
        return "lm_head.weight" not in weight_names(folder)
    except (OSError, ValueError):  # no readable safetensors header: assume a full model
        return False


def _modules(folder: Path) -> list[dict[str, Any]]:
    path = folder / "modules.json"
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        modules = json.load(f)
    return [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []


def _st_head(pooling_dir: Path, normalize: bool) -> EmbeddingHead | None:
    path = pooling_dir / "config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    modes = [mode for key, mode in _POOLING_MODES.items() if config.get(key)]
    if not modes:
        chosen = [k for k, v in config.items() if k.startswith("pooling_mode") and v]
        logger.warning("pooling %s is not supported (last token or mean only)", chosen)
        return None
    return EmbeddingHead(modes[0], normalize)
