"""DiskTier: KV chunks in files, kept across restarts and model unloads, within a byte budget.

Layout: `<root>/<fingerprint>/model.json` says which model a folder is for (the fingerprint
covers the weights file, backend, KV dtype and layout: a different model, quantization or
backend never reads another's KV), and `<root>/<fingerprint>/<xx>/<digest>.kv` is one chunk.
Beside them, `<xx>/<parent>.next` lists the chunks stored after chunk `parent` (a line each:
digest and tokens), so a prompt that parts from a stored path inside a chunk still finds the
tokens they share (`children`); lines are appended whole, and a line naming a chunk since
deleted or damaged is a miss. Likewise `<xx>/<parent>.states` lists the model states (recurrent
layers) stored after chunk `parent` (a line each: digest and how many tokens past that chunk),
so a prompt's states are found with one read per chunk (`states`); a state's line is appended
before its file is written, so a crash leaves at most a line naming nothing (a miss).
A file is a magic line, a JSON header, the tokens, the KV bytes and a checksum of all of it;
it is written under a temporary name and renamed into place, so a crash mid-write leaves no
file a reader loads, and a torn or flipped file fails its checksum: it is skipped with one
warning and deleted. Files and folders are the user's alone (prompts are private data).

Writes happen on a background thread, so demoting KV costs the engine loop a copy, not disk
time; a chunk still queued is served from the queue. The budget is the whole root's (every
model's): past it, the files used least recently (mtime, refreshed on every hit) go first.
Two servers may share a root: names are content digests, renames are atomic, and a file that
vanishes under a reader is a miss.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localradix.mem.disk_files import (
    CHECKSUM_BYTES,
    CHILDREN_SUFFIX,
    MODEL_FILE,
    STATES_SUFFIX,
    SUFFIX,
    append_line,
    checksum,
    map_file,
    parse_child,
    parse_state,
    private_dir,
    state_line,
    touch,
    unlink,
    walk,
    write_atomic,
)
from localradix.mem.disk_files import StoredModel as StoredModel  # (re-exported)
from localradix.mem.disk_files import clear_stored as clear_stored
from localradix.mem.disk_files import stored_models as stored_models
from localradix.mem.kv_chunks import DIGEST_BYTES, KVChunk

logger = logging.getLogger("localradix.kv_disk")

MAGIC = b"LRKV\x02\n"
MAX_CHILDREN = 64  # lines of a children list read (the newest): a root's list may grow long
MAX_STATES = 256  # lines of a states list read (the newest): several servers may append
STALE_TMP_S = 600  # a temporary file this old was left by a writer that died
TRIM_TO = 0.9  # past the budget, delete down to this share of it (fewer rescans)
QUEUE_BYTES = 256 * 2**20  # demoted KV waiting for the writer; beyond it a demotion is dropped


@dataclass
class DiskStats:
    files_written: int = 0
    bytes_written: int = 0
    files_read: int = 0
    bytes_read: int = 0
    read_seconds: float = 0.0
    corrupt: int = 0  # files skipped: torn, flipped, or not what their name says
    dropped: int = 0  # demotions not written: the writer was too far behind
    deleted: int = 0  # files removed to keep the budget


class DiskTier:
    def __init__(
        self,
        root: Path,
        fingerprint: str,
        budget_bytes: int,
        model: dict[str, Any],
        queue_bytes: int = QUEUE_BYTES,
    ) -> None:
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.folder = self.root / fingerprint
        self.budget = budget_bytes
        self.queue_bytes = queue_bytes
        self.stats = DiskStats()
        private_dir(self.root)
        private_dir(self.folder)
        write_atomic(self.folder / MODEL_FILE, json.dumps(model, indent=1).encode())
        self._lock = threading.Lock()
        self._pending: dict[bytes, KVChunk] = {}
        self._pending_bytes = 0
        self._queue: queue.Queue[KVChunk | None] = queue.Queue()
        self._total = self._trim()  # bytes under the root, as last counted plus written since
        self._thread = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._thread.start()

    # ---- what the tiers call ------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        """Bytes under the root (every model's), as last counted plus those written since."""
        return self._total

    def has(self, digest: bytes) -> bool:
        with self._lock:
            if digest in self._pending:
                return True
        return self._path(digest).is_file()

    def get(self, digest: bytes) -> KVChunk | None:
        """The chunk named `digest`, verified; None when absent or damaged (then deleted)."""
        with self._lock:
            chunk = self._pending.get(digest)
        if chunk is not None:
            return chunk
        path = self._path(digest)
        started = time.perf_counter()
        try:
            raw = map_file(path)
        except OSError:
            return None
        chunk = self._decode(raw, digest, path)
        if chunk is None:
            return None
        self.stats.files_read += 1
        self.stats.bytes_read += len(raw)
        self.stats.read_seconds += time.perf_counter() - started
        touch(path)  # least recently used goes first
        return chunk

    def children(self, parent: bytes) -> list[tuple[bytes, np.ndarray]]:
        """(digest, tokens) of the chunks stored or queued after `parent`, newest first; the
        tokens are as listed, unverified (`get` verifies the chunk itself)."""
        with self._lock:
            pending = self._pending.values()
            found = [(c.digest, c.tokens) for c in pending if c.parent == parent and not c.state]
        path = self._children_path(parent)
        try:
            lines = path.read_bytes().splitlines()[-MAX_CHILDREN:]
        except OSError:
            return found
        touch(path)
        for line in reversed(lines):
            child = parse_child(line)
            if child is not None:
                found.append(child)
        return found

    def states(self, parent: bytes) -> list[tuple[bytes, int]]:
        """(digest, tail length) of the states stored or queued after chunk `parent`, as
        listed (a torn or garbled line is skipped; `get` verifies the state itself)."""
        with self._lock:
            pending = self._pending.values()
            found = [(c.digest, len(c.tokens)) for c in pending if c.parent == parent and c.state]
        path = self._path(parent, STATES_SUFFIX)
        try:
            lines = path.read_bytes().splitlines()[-MAX_STATES:]
        except OSError:
            return found
        touch(path)
        return found + [s for s in map(parse_state, lines) if s is not None]

    def put(self, chunk: KVChunk, wait: bool = False) -> bool:
        """Queue `chunk` for writing; False (dropped) when the writer is too far behind,
        unless `wait` (a shutdown's drain): then wait for it to catch up."""
        if wait and self._pending_bytes + chunk.nbytes > self.queue_bytes:
            self.flush()
        with self._lock:
            if chunk.digest in self._pending:
                return True
            if self._pending_bytes + chunk.nbytes > self.queue_bytes:
                self.stats.dropped += 1
                return False
            self._pending[chunk.digest] = chunk
            self._pending_bytes += chunk.nbytes
        self._queue.put(chunk)
        return True

    def touch(self, digest: bytes) -> None:
        """Mark a chunk already on disk as just used."""
        touch(self._path(digest))

    def flush(self) -> None:
        """Wait until every queued chunk is on disk."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued and stop the writer (a graceful shutdown)."""
        self.flush()
        self._queue.put(None)
        self._thread.join()

    # ---- the writer thread --------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            chunk = self._queue.get()
            try:
                if chunk is None:
                    return
                self._write(chunk)
            except OSError as exc:  # a full or read-only disk: the cache is an optimisation
                logger.warning("KV disk cache: could not write a chunk (%s)", exc)
            finally:
                if chunk is not None:
                    with self._lock:
                        self._pending.pop(chunk.digest, None)
                        self._pending_bytes -= chunk.nbytes
                self._queue.task_done()

    def _write(self, chunk: KVChunk) -> None:
        path = self._path(chunk.digest)
        if path.is_file():
            touch(path)
            return
        private_dir(path.parent)
        data = self._encode(chunk)
        if chunk.state:  # listed first: a crash between leaves a line naming nothing
            append_line(
                self._path(chunk.parent, STATES_SUFFIX), state_line(chunk.digest, len(chunk.tokens))
            )
        write_atomic(path, data)
        if not chunk.state:
            line = chunk.digest.hex() + " " + ",".join(map(str, chunk.tokens.tolist())) + "\n"
            append_line(self._children_path(chunk.parent), line.encode())
        self.stats.files_written += 1
        self.stats.bytes_written += len(data)
        self._total += len(data)
        if self._total > self.budget:
            self._total = self._trim()

    def _trim(self) -> int:
        """Delete the least recently used files until the root is within budget (and stale
        temporary files); return the bytes left."""
        files, total = [], 0
        for path, stat in walk(self.root):
            if path.name.endswith(".tmp"):
                if time.time() - stat.st_mtime > STALE_TMP_S:
                    unlink(path)
                continue
            files.append((stat.st_mtime, stat.st_size, path))
            total += stat.st_size
        if total <= self.budget:
            return total
        files.sort()
        target = int(self.budget * TRIM_TO)
        for _, size, path in files:
            if total <= target:
                break
            if unlink(path):
                total -= size
                self.stats.deleted += 1
        return total

    # ---- the file format ----------------------------------------------------------------------

    def _path(self, digest: bytes, suffix: str = SUFFIX) -> Path:
        name = digest.hex()
        return self.folder / name[:2] / (name + suffix)

    def _children_path(self, parent: bytes) -> Path:
        return self._path(parent, CHILDREN_SUFFIX)

    def _encode(self, chunk: KVChunk) -> bytes:
        header = json.dumps(
            {
                "fingerprint": self.fingerprint,
                "parent": chunk.parent.hex(),
                "tokens": len(chunk.tokens),
                "rows": int(chunk.data.shape[0]),
                "bytes_per_token": int(chunk.data.shape[1]),
                "state": chunk.state,
            }
        ).encode()
        body = b"".join(
            (
                MAGIC,
                len(header).to_bytes(4, "little"),
                header,
                np.ascontiguousarray(chunk.tokens, dtype="<i8").tobytes(),
                np.ascontiguousarray(chunk.data, dtype=np.uint8).tobytes(),
            )
        )
        return body + checksum(body)

    def _decode(self, raw: memoryview, digest: bytes, path: Path) -> KVChunk | None:
        try:
            chunk = self._parse(raw, digest)
        except (ValueError, KeyError, TypeError) as exc:
            chunk, why = None, str(exc)
        else:
            why = "its tokens are not what its name says"
        if chunk is not None and chunk.verifies():
            return chunk
        self.stats.corrupt += 1
        logger.warning("KV disk cache: skipping and deleting %s (%s)", path, why)
        unlink(path)
        return None

    def _parse(self, raw: memoryview, digest: bytes) -> KVChunk:
        body, stored = raw[:-CHECKSUM_BYTES], bytes(raw[-CHECKSUM_BYTES:])
        if len(raw) < len(MAGIC) + 4 + CHECKSUM_BYTES or bytes(raw[: len(MAGIC)]) != MAGIC:
            raise ValueError("not a KV chunk file")
        if checksum(body) != stored:
            raise ValueError("checksum mismatch: a torn or damaged file")
        start = len(MAGIC) + 4
        end = start + int.from_bytes(body[len(MAGIC) : start], "little")
        header = json.loads(bytes(body[start:end]))
        if header["fingerprint"] != self.fingerprint:
            raise ValueError("written for another model")
        n, width = int(header["tokens"]), int(header["bytes_per_token"])
        rows = int(header.get("rows", n))
        if len(body) != end + 8 * n + rows * width:
            raise ValueError("its size does not match its header")
        tokens = np.frombuffer(body, dtype="<i8", count=n, offset=end).astype(np.int64)
        data = np.frombuffer(body, dtype=np.uint8, count=rows * width, offset=end + 8 * n)
        parent = bytes.fromhex(header["parent"])
        if len(parent) != DIGEST_BYTES:
            raise ValueError("bad parent digest")
        state = bool(header.get("state", False))
        return KVChunk(digest, parent, tokens, data.reshape(rows, width), state)
