"""Is a pulled model whole? GGUF headers and tensor extents, config.json, safetensors extents.

The hub checks that each download has the size the server announced; this checks that the
file itself is what it claims to be, so a repo holding a truncated or corrupt file is refused at
`pull` (and its files removed) instead of failing at `serve`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from localradix.store.catalog import StoreEntry
from localradix.store.errors import StoreError


def check_entry(entry: StoreEntry) -> None:
    """Raise StoreError naming the first broken file of `entry`."""
    if entry.format == "gguf":
        for path in entry.files:
            _check(path, _gguf_problem(path))
        return
    assert entry.path is not None
    _check(entry.path / "config.json", _config_problem(entry.path / "config.json"))
    for path in sorted(entry.path.glob("*.safetensors")):
        _check(path, _safetensors_problem(path))


def _check(path: Path, problem: str | None) -> None:
    if problem is not None:
        raise StoreError(f"{path.name} is {problem}")


def _gguf_problem(path: Path) -> str | None:
    from localradix.gguf_file import read_gguf_file

    try:
        read_gguf_file(path)  # tensor views are cut at the file's end: a short one fails to reshape
    except (ValueError, KeyError, IndexError, struct.error, OSError) as exc:
        return f"not a whole GGUF file ({str(exc).splitlines()[0][:120]})"
    return None


def _config_problem(path: Path) -> str | None:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"not valid JSON ({exc})"
    return None if isinstance(config, dict) else "not a JSON object"


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > size:
                return "not a safetensors file (its header is longer than the file)"
            header = json.loads(f.read(header_len))
    except (OSError, ValueError, struct.error) as exc:
        return f"not a safetensors file ({exc})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    needed = 8 + header_len + max(ends, default=0)
    return None if needed <= size else f"truncated ({size} of {needed} bytes)"
