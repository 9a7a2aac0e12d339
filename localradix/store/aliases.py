"""User-given aliases: `<localradix cache>/aliases.json`, a JSON object `{"alias": "REPO:QUANT"}`.

Derived aliases need no file; this one holds only the names a user chose (the `alias` command),
and may be edited by hand.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from localradix.store.errors import StoreError

ALIAS = re.compile(r"[a-z0-9][a-z0-9._:-]*")


def aliases_path() -> Path:
    from localradix.paths import cache_root

    return cache_root() / "aliases.json"


def load_aliases() -> dict[str, str]:
    path = aliases_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"{path} is not a JSON object of aliases ({exc}): fix or delete it"
        ) from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise StoreError(f"{path} is not a JSON object of aliases: fix or delete it")
    return {str(k).lower(): v for k, v in data.items()}


def check_alias(alias: str) -> str:
    alias = alias.lower()
    if not ALIAS.fullmatch(alias):
        raise StoreError(
            f"{alias!r} is not a usable alias: use lower-case letters, digits and . _ : - "
            "(no '/', which marks a repo id), e.g. `coder:7b`"
        )
    return alias


def save_aliases(aliases: dict[str, str]) -> None:
    path = aliases_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(sorted(aliases.items())), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def set_alias(alias: str, ref: str) -> None:
    aliases = load_aliases()
    aliases[check_alias(alias)] = ref
    save_aliases(aliases)


def drop_aliases_of(ref: str) -> list[str]:
    """Forget every alias naming `ref` (its model was removed); returns them."""
    aliases = load_aliases()
    dropped = [a for a, target in aliases.items() if target.lower() == ref.lower()]
    if dropped:
        save_aliases({a: t for a, t in aliases.items() if a not in dropped})
    return dropped
