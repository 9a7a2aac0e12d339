"""What is in the store: a scan of the hub cache's snapshots, plus the bundled model.

Each complete GGUF choice (all its shards present) is one entry, and so is a snapshot holding
config.json and weights (a safetensors or MLX folder). The scan reads only names, sizes and
config.json; `describe` reads a GGUF header for `ls`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localradix.store.names import derive_alias, gguf_choices, quant_of

BUNDLED_REF = "bundled"
_GENERATIVE = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


@dataclass(frozen=True)
class StoreEntry:
    repo: str | None  # None for the bundled model
    variant: str | None  # the GGUF quant label; None for a folder
    format: str  # "gguf", "safetensors" or "mlx"
    quantization: str  # Q4_K_M, 4bit, bf16, ...
    path: Path | None  # what to load: the (first) .gguf or the folder; None: not fetched yet
    files: tuple[Path, ...]  # snapshot files that are this model's (what `rm` deletes)
    alias: str  # the derived short name

    @property
    def ref(self) -> str:
        """The canonical name: `org/name:QUANT`, `org/name`, or `bundled`."""
        if self.repo is None:
            return BUNDLED_REF
        return f"{self.repo}:{self.variant}" if self.variant else self.repo

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.files if p.exists())


@dataclass(frozen=True)
class ModelFacts:
    architecture: str
    context_length: int | None


def hub_cache() -> Path:
    """The hub's cache folder, found as huggingface-hub's constants.py finds it (without
    importing it): $HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/..."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    folder = (
        os.environ.get("HF_HUB_CACHE")
        or os.environ.get("HUGGINGFACE_HUB_CACHE")
        or os.path.join(os.path.expanduser(os.path.expandvars(home)), "hub")
    )
    return Path(os.path.expandvars(os.path.expanduser(folder)))


def repo_dir(repo: str) -> Path:
    return hub_cache() / f"models--{repo.replace('/', '--')}"


def scan() -> list[StoreEntry]:
    """Every model in the store: the bundled one first, then the hub cache's, by name."""
    found: dict[str, StoreEntry] = {}
    cache = hub_cache()
    folders = sorted(cache.glob("models--*")) if cache.is_dir() else []
    for folder in folders:
        repo = "/".join(folder.name.split("--")[1:])
        for entry in scan_repo(repo, folder):
            found.setdefault(entry.ref.lower(), entry)  # newest snapshot first
    return [bundled_entry(), *sorted(found.values(), key=lambda e: e.ref.lower())]


def scan_repo(repo: str, folder: Path) -> Iterator[StoreEntry]:
    snapshots = folder / "snapshots"
    if not snapshots.is_dir():
        return
    for snapshot in sorted(snapshots.iterdir(), key=_mtime, reverse=True):
        yield from snapshot_entries(repo, snapshot)


def snapshot_entries(repo: str, snapshot: Path) -> Iterator[StoreEntry]:
    sizes = {
        p.relative_to(snapshot).as_posix(): p.stat().st_size
        for p in snapshot.rglob("*")
        if p.is_file()  # follows the symlink: a dangling one (blob gone) is not a file
    }
    for choice in gguf_choices(sizes):
        if choice.complete:
            files = tuple(snapshot / f for f in choice.files)
            stem_names = [choice.files[0], repo]
            alias = derive_alias(stem_names, choice.label)
            yield StoreEntry(repo, choice.label, "gguf", choice.label, files[0], files, alias)
    folder = folder_entry(repo, snapshot, sizes)
    if folder is not None:
        yield folder


def folder_entry(repo: str, snapshot: Path, sizes: dict[str, int]) -> StoreEntry | None:
    weights = [f for f in sizes if "/" not in f and _is_weights(f)]
    if "config.json" not in sizes or not weights:
        return None
    config = _read_json(snapshot / "config.json")
    if not _generates_text(config):
        return None  # an encoder, a classifier: in the hub cache, not a model to chat with
    quant = config.get("quantization")
    if isinstance(quant, dict) and "bits" in quant:
        fmt, label = "mlx", f"{quant['bits']}bit"
    else:
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
        fmt, label = "safetensors", _DTYPES.get(dtype, dtype or "-")
    files = tuple(snapshot / f for f in sizes if not f.lower().endswith(".gguf"))
    alias = derive_alias([repo], label if label != "-" else None)
    return StoreEntry(repo, None, fmt, label, snapshot, files, alias)


def bundled_entry() -> StoreEntry:
    """The bundled model, listed whether or not it was fetched yet."""
    from localradix.store.bundled import SMOLLM2, find_bundled

    path = find_bundled(SMOLLM2)
    quant = quant_of(SMOLLM2.file) or "-"
    alias = derive_alias([SMOLLM2.file], quant)
    return StoreEntry(None, None, "gguf", quant, path, (path,) if path else (), alias)


def describe(entry: StoreEntry) -> ModelFacts | None:
    """Architecture and context length, from the GGUF header or config.json (None: unreadable
    or not fetched)."""
    if entry.path is None:
        return None
    try:
        if entry.format == "gguf":
            from localradix.gguf_file import read_gguf

            meta = read_gguf(entry.path, tensors=False).metadata
            arch = str(meta.get("general.architecture", "?"))
            return ModelFacts(arch, meta.get(f"{arch}.context_length"))
        config = _read_json(entry.path / "config.json")
        archs = config.get("architectures") or [config.get("model_type", "?")]
        return ModelFacts(str(archs[0]), config.get("max_position_embeddings"))
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _generates_text(config: dict[str, Any]) -> bool:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs:
        return True  # unnamed: let loading decide
    return any(str(a).endswith(_GENERATIVE) for a in archs)


def _is_weights(name: str) -> bool:
    lower = name.lower()
    return lower.endswith(".safetensors") or (
        lower.startswith("pytorch_model") and lower.endswith(".bin")
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
