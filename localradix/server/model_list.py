"""The models a server can answer for (`/v1/models`, Ollama's `/api/tags`): the loaded ones,
the default first, then every other model in the store (loaded on first use)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localradix.store.source import ModelSource

if TYPE_CHECKING:
    from localradix.server.model_pool import ModelPool
    from localradix.store.catalog import StoreEntry


@dataclass(frozen=True)
class Listed:
    name: str
    path: str
    context_length: int  # 0: unknown (a header that cannot be read)
    architecture: str
    loaded: bool


def listed_models(pool: ModelPool, context_length: int | None = None) -> list[Listed]:
    """Loaded models, then the store's others (reads the store: call it in a thread).
    `context_length`: the server's --context-length, which an unloaded model will get."""
    from localradix.store.catalog import describe, scan

    entries = scan()
    names = served_names(entries)
    rows = [
        Listed(info.name, info.path, info.context_length, info.architecture, True)
        for r in pool.residents
        if r.live and (info := r.client.model_info) is not None
    ]
    loaded = pool.loaded_keys()
    for entry in entries:
        if entry.path is None or model_key(entry.path) in loaded:
            continue
        facts = describe(entry)
        context = context_length or (facts.context_length if facts else None) or 0
        arch = facts.architecture if facts else ""
        rows.append(Listed(names[entry.ref], str(entry.path), int(context), arch, False))
    return rows


def served_names(entries: list[StoreEntry]) -> dict[str, str]:
    """Each entry's name in the API (by ref): the user's alias (as `ls` shows), else the
    derived one, else (two entries derive the same alias) the ref, which names one."""
    from localradix.store.aliases import load_aliases

    named = {target.lower(): alias for alias, target in load_aliases().items()}
    derived = Counter(e.alias for e in entries)
    return {
        e.ref: named.get(e.ref.lower()) or (e.alias if derived[e.alias] == 1 else e.ref)
        for e in entries
    }


def model_key(path: Path) -> str:
    """One model, however its path is spelled (a snapshot's symlink and its blob agree)."""
    try:
        return str(Path(path).resolve())
    except OSError:
        return str(path)


def store_source(model: str) -> ModelSource | None:
    """The store model `model` names (alias, ref, repo id, or its path), as a ModelSource
    named as the API lists it; None if it names none (StoreError: it names several)."""
    from localradix.store.catalog import scan
    from localradix.store.lookup import find_entry

    entries = scan()
    entry = find_entry(model, entries)
    if entry is None and ("/" in model or "\\" in model):
        wanted = model_key(Path(model).expanduser())
        entry = next((e for e in entries if e.path and model_key(e.path) == wanted), None)
    if entry is None or entry.path is None:
        return None
    name = served_names(entries)[entry.ref]
    return ModelSource(entry.path, "gguf" if entry.format == "gguf" else "hf", name)
