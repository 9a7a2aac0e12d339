"""The disk tier's files: written under a temporary name and renamed, appended a whole line at
a time, mapped copy-on-write to read, walked to count the budget; and what `localradix cache`
lists per model and clears. Files and folders are the user's alone (prompts are private data).
"""

from __future__ import annotations

import json
import mmap
import os
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localradix.mem.kv_chunks import DIGEST_BYTES

CHECKSUM_BYTES = 4  # CRC-32: torn writes and flipped bits, at memory speed (blake2b: 5x slower)
SUFFIX = ".kv"
CHILDREN_SUFFIX = ".next"
STATES_SUFFIX = ".states"  # per chunk: the states stored after it (`parse_state`)
# What the budget counts and `clear` deletes:
KEPT_SUFFIXES = (SUFFIX, CHILDREN_SUFFIX, STATES_SUFFIX, ".tmp")
MODEL_FILE = "model.json"


# ---- what `localradix cache` shows and clears ---------------------------------------------------


@dataclass(frozen=True)
class StoredModel:
    fingerprint: str
    model: dict[str, Any]  # the model.json its server wrote
    files: int
    bytes: int
    newest: float  # mtime of the most recently used chunk (0: none)
    oldest: float


def stored_models(root: Path) -> list[StoredModel]:
    """Every model folder under `root`, most recently used first."""
    out = []
    root = Path(root)
    if not root.is_dir():
        return []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            model = json.loads((folder / MODEL_FILE).read_text())
        except (OSError, ValueError):
            model = {}
        kept = list(walk(folder))  # chunks, their children lists, unfinished writes
        stats = [s for p, s in kept if p.name.endswith(SUFFIX)]
        times = [s.st_mtime for s in stats]
        out.append(
            StoredModel(
                folder.name,
                model,
                len(stats),
                sum(s.st_size for _, s in kept),
                max(times, default=0.0),
                min(times, default=0.0),
            )
        )
    return sorted(out, key=lambda m: -m.newest)


def clear_stored(root: Path, fingerprint: str | None = None) -> int:
    """Delete every chunk under `root` (or one model's folder); return the bytes freed."""
    root = Path(root)
    top = root / fingerprint if fingerprint else root
    freed = 0
    for path, stat in list(walk(top)):
        if unlink(path):
            freed += stat.st_size
    return freed


# ---- files ----------------------------------------------------------------------------------


def walk(top: Path) -> Iterator[tuple[Path, os.stat_result]]:
    for dirpath, _, names in os.walk(top):
        for name in names:
            if not name.endswith(KEPT_SUFFIXES):
                continue
            path = Path(dirpath) / name
            try:
                yield path, path.stat()
            except OSError:
                continue  # deleted meanwhile (another server's trim)


def private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        unlink(tmp)
        raise


def append_line(path: Path, line: bytes) -> None:
    """Append one whole line (a single write: two servers' lines never interleave)."""
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def parse_child(line: bytes) -> tuple[bytes, np.ndarray] | None:
    """A children-list line as (digest, tokens); None for a torn or garbled one."""
    try:
        name, tokens = line.split(b" ")
        digest = bytes.fromhex(name.decode())
        ids = np.array([int(t) for t in tokens.split(b",")], dtype=np.int64)
    except ValueError:
        return None
    return (digest, ids) if len(digest) == DIGEST_BYTES else None


def state_line(digest: bytes, tail: int) -> bytes:
    """A states-list line: a state's digest and its tail's length (tokens past its chunk)."""
    return f"{digest.hex()} {tail}\n".encode()


def parse_state(line: bytes) -> tuple[bytes, int] | None:
    """A states-list line as (digest, tail length); None for a torn or garbled one."""
    try:
        name, tail = line.split(b" ")
        digest, length = bytes.fromhex(name.decode()), int(tail)
    except ValueError:
        return None
    return (digest, length) if len(digest) == DIGEST_BYTES and length >= 0 else None


def checksum(data: bytes | memoryview) -> bytes:
    return zlib.crc32(data).to_bytes(CHECKSUM_BYTES, "little")


def map_file(path: Path) -> memoryview:
    """The file's bytes, mapped copy-on-write: the KV arrays view the OS page cache itself
    (no copy, no fresh memory) and are writable, as torch wants (a write would copy a page,
    never touch the file)."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return memoryview(b"")
        return memoryview(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY))


def touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False
