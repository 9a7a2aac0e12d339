"""KV chunks: the unit the lower cache tiers (host memory, disk) store, named by content.

The radix tree's nodes split and merge as traffic changes, so the tiers below it do not store
nodes: they store fixed runs of `chunk` tokens at fixed offsets (0, chunk, 2 chunk, ...), each
named by a chained digest of every token up to its end (and the namespace, `extra_key`), as
vLLM's and llama.cpp's hashed blocks are. A chunk's name therefore fixes its whole prefix: equal
names mean equal KV (within one model fingerprint), two servers writing the same chunk write
the same file, and a lookup walks the prompt's chunks from the start until one is missing. The
tail of a path shorter than a chunk is not kept below the tree.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

# Short, so that a restarted prompt loses at most 31 tokens to prefill (each costs attention
# over the whole context); a file per chunk still costs little (0.7 MB for a 135M model).
CHUNK_TOKENS = 32
DIGEST_BYTES = 16
_SEED = b"localradix-kv-chunk-v1"


def chunk_size(page_size: int) -> int:
    """`CHUNK_TOKENS` rounded up to whole pages (a chunk is loaded into whole pages)."""
    return -(-CHUNK_TOKENS // page_size) * page_size


def root_digest(extra_key: str | None) -> bytes:
    """The digest before any token: the namespace alone."""
    return hashlib.blake2b(_SEED + (extra_key or "").encode(), digest_size=DIGEST_BYTES).digest()


def next_digest(parent: bytes, tokens: np.ndarray) -> bytes:
    """The digest of a chunk: its parent's digest and its own tokens."""
    data = parent + np.ascontiguousarray(tokens, dtype="<i8").tobytes()
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def state_digest(parent: bytes, tail: np.ndarray) -> bytes:
    """The name of a model state (recurrent layers) after the chunk `parent` and `tail`'s
    tokens: a state may end anywhere, not only on chunk boundaries."""
    data = b"state" + parent + np.ascontiguousarray(tail, dtype="<i8").tobytes()
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def chain(
    key: np.ndarray, extra_key: str | None, chunk: int, upto: int | None = None
) -> list[bytes]:
    """Digests of `key`'s whole chunks (at most `upto`, whose ends are <= len(key)): entry i
    names `key[: (i + 1) * chunk]`."""
    count = len(key) // chunk if upto is None else min(upto, len(key) // chunk)
    digests: list[bytes] = []
    parent = root_digest(extra_key)
    for i in range(count):
        parent = next_digest(parent, key[i * chunk : (i + 1) * chunk])
        digests.append(parent)
    return digests


@dataclass(frozen=True, eq=False)
class KVChunk:
    """One chunk of KV: `tokens` (int64 [chunk]) and their KV, token-major: `data` is uint8
    [chunk, bytes_per_token] as the runner's `KVTransfer.read` returned it. With `state`, a
    model state instead: the state after `parent` and `tokens` (the tail past that chunk),
    `data` uint8 [1, bytes] as the runner exported it."""

    digest: bytes
    parent: bytes
    tokens: np.ndarray
    data: np.ndarray
    state: bool = False

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def verifies(self) -> bool:
        """Whether `digest` really names `parent` + `tokens` (guards a file's name)."""
        name = state_digest if self.state else next_digest
        return name(self.parent, self.tokens) == self.digest
