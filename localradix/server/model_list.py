"""The models a server can answer for (`/v1/models`, Ollama's `/api/tags`): the loaded ones,
the default first, then every other model in the store (loaded on first use)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localradix.server.model_pool import ModelPool


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
    from localradix.server.model_pool import model_key
    from localradix.store.catalog import describe, scan

    rows = [
        Listed(info.name, info.path, info.context_length, info.architecture, True)
        for r in pool.residents
        if r.live and (info := r.client.model_info) is not None
    ]
    loaded = pool.loaded_keys()
    for entry in scan():
        if entry.path is None or model_key(entry.path) in loaded:
            continue
        facts = describe(entry)
        context = context_length or (facts.context_length if facts else None) or 0
        arch = facts.architecture if facts else ""
        rows.append(Listed(entry.alias, str(entry.path), int(context), arch, False))
    return rows
