"""PendingChunks: chunks going down a tier whose KV is still being copied off the device.

A runner whose `KVTransfer` has `read_async` (a GPU's: pinned host memory, a side stream)
returns a handle at once; the chunks wait here, named but without bytes, until the copy is done
or the tiers need them, and go down in the order they were demoted. Until then a lookup of
their names says "held", so the same KV is not copied twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from localradix.mem.kv_chunks import KVChunk

# Chunk name, its parent's, its tokens: a chunk but for its KV.
Named = tuple[bytes, bytes, np.ndarray]


class PendingRows(Protocol):
    def done(self) -> bool:
        """Whether the copy has landed (never waits)."""
        ...

    def result(self) -> np.ndarray:
        """uint8 [tokens, bytes_per_token], waiting for the copy if need be."""
        ...


def chunks(named: list[Named], data: np.ndarray) -> Iterator[KVChunk]:
    """Each named chunk with its rows of `data` (views), in order."""
    done = 0
    for digest, parent, tokens in named:
        yield KVChunk(digest, parent, tokens, data[done : done + len(tokens)])
        done += len(tokens)


class PendingChunks:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes  # in flight at most; the oldest are waited for past it
        self._queue: deque[tuple[list[Named], PendingRows, int]] = deque()
        self._names: set[bytes] = set()
        self.bytes = 0

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._names

    def add(self, named: list[Named], rows: PendingRows, nbytes: int) -> None:
        self._queue.append((named, rows, nbytes))
        self._names.update(digest for digest, _, _ in named)
        self.bytes += nbytes

    def take(self, wait: bool) -> Iterator[KVChunk]:
        """The chunks whose copies are done, oldest first (every one with `wait`, and the
        oldest while more than `max_bytes` are in flight)."""
        while self._queue:
            named, rows, nbytes = self._queue[0]
            if not (wait or self.bytes > self.max_bytes or rows.done()):
                return
            data = rows.result()
            self._queue.popleft()
            self._names.difference_update(digest for digest, _, _ in named)
            self.bytes -= nbytes
            yield from chunks(named, data)
