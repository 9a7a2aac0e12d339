"""HostTier: KV chunks in host memory, least recently used first out (to the disk tier).

For GPU runners, host RAM is far larger than the device's KV pool and loading a chunk back
costs one host-to-device copy, far less than prefilling it again. Chunks leaving this tier for
lack of room go down to the disk tier when there is one (`spill`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

import numpy as np

from localradix.mem.kv_chunks import KVChunk


class HostTier:
    def __init__(self, budget_bytes: int, spill: Callable[[KVChunk], object] | None = None) -> None:
        self.budget = budget_bytes
        self.spill = spill
        self._chunks: OrderedDict[bytes, KVChunk] = OrderedDict()
        self._children: dict[bytes, dict[bytes, None]] = {}  # parent -> its chunks, in order
        self.bytes = 0

    @property
    def count(self) -> int:
        return len(self._chunks)

    def has(self, digest: bytes) -> bool:
        return digest in self._chunks

    def get(self, digest: bytes) -> KVChunk | None:
        chunk = self._chunks.get(digest)
        if chunk is not None:
            self._chunks.move_to_end(digest)
        return chunk

    def children(self, parent: bytes) -> list[tuple[bytes, np.ndarray]]:
        """(digest, tokens) of the chunks held that follow `parent`."""
        return [(d, self._chunks[d].tokens) for d in self._children.get(parent, ())]

    def put(self, chunk: KVChunk) -> None:
        if chunk.digest in self._chunks:
            self._chunks.move_to_end(chunk.digest)
            return
        if chunk.nbytes > self.budget:
            self._spill(chunk)
            return
        self._chunks[chunk.digest] = chunk
        if not chunk.state:
            self._children.setdefault(chunk.parent, {})[chunk.digest] = None
        self.bytes += chunk.nbytes
        while self.bytes > self.budget:
            self._spill(self._pop_oldest())

    def drain(self) -> Iterator[KVChunk]:
        """Every chunk, oldest first, emptying the tier (a graceful shutdown)."""
        while self._chunks:
            yield self._pop_oldest()

    def _pop_oldest(self) -> KVChunk:
        _, chunk = self._chunks.popitem(last=False)
        self.bytes -= chunk.nbytes
        siblings = self._children.get(chunk.parent, {})
        siblings.pop(chunk.digest, None)
        if not siblings:
            self._children.pop(chunk.parent, None)
        return chunk

    def _spill(self, chunk: KVChunk) -> None:
        if self.spill is not None:
            self.spill(chunk)
