"""Drafts from the radix cache: what followed a request's last tokens in any cached sequence.

The tree holds every prompt and output the engine has seen (until evicted), so a second "rename
X to Y" over the same file, a regenerated answer or a sibling of an `n > 1` request finds its
continuation there. `ContinuationSource` is the seam: `TreeContinuations` satisfies it over
anything shaped like `RadixCache` (read-only: no split, no access stamp, no lock), and the
cache may later answer it itself.

The tree is indexed by prefix, not by substring, so `TreeContinuations` keeps a flat snapshot
of each namespace's tokens with its `min_match`-grams hashed and sorted (a query is a binary
search). A rebuild costs time linear in the cached tokens (~30 ms for 100k), so it happens
when the cache's size changed (or `refresh_every` queries passed) and at most once every
`min_interval_s`. A stale snapshot only costs draft quality: it holds its own copies of the
keys, and verification never trusts a draft.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from localradix.spec.grams import gram_hashes

__all__ = ["CachedNode", "CachedTree", "Continuation", "ContinuationSource", "TreeContinuations"]

_SEPARATOR = np.array([-1], dtype=np.int64)  # between segments: never equals a token id
_MAX_TRIES = 8  # best-ranked matches tried for a non-empty continuation
_MAX_CANDIDATES = 1024  # occurrences of one anchor compared (a common gram may recur a lot)


@dataclass(frozen=True)
class Continuation:
    tokens: np.ndarray  # int64, non-empty: what followed the match
    match_len: int  # how many trailing tokens of the query the match agreed with


class ContinuationSource(Protocol):
    def continuation(
        self, suffix: np.ndarray, max_tokens: int, extra_key: str | None = None
    ) -> Continuation | None:
        """Up to `max_tokens` tokens that followed `suffix` (a request's last tokens, the
        longest agreement wins) in a cached sequence of namespace `extra_key`; None if no
        match of at least the source's minimum length continues."""
        ...


class CachedNode(Protocol):
    """What the walk reads of a `TreeNode`."""

    @property
    def key(self) -> np.ndarray: ...
    @property
    def children(self) -> Mapping[Hashable, CachedNode]: ...
    @property
    def extra_key(self) -> str | None: ...
    @property
    def last_access_time(self) -> int: ...


class CachedTree(Protocol):
    """What the walk reads of a `RadixCache`."""

    @property
    def root(self) -> CachedNode: ...
    @property
    def total_size(self) -> int: ...


@dataclass(frozen=True)
class _Snapshot:
    """One namespace's nodes as one flat array: per node, its path's last `max_match - 1`
    tokens (so matches may span node edges), its key, a separator."""

    flat: np.ndarray  # int64 [N]
    owner: np.ndarray  # int64 [N]: index into nodes/keys
    offset: np.ndarray  # int64 [N]: index into that node's key; < 0 in the path tail
    nodes: tuple[CachedNode, ...]
    keys: tuple[np.ndarray, ...]  # each node's key when the snapshot was taken
    hashes: np.ndarray  # uint64 [M]: sorted hashes of the grams ending at `ends`
    ends: np.ndarray  # int64 [M]: flat positions, ordered by hash


class TreeContinuations:
    """`ContinuationSource` over a radix cache."""

    def __init__(
        self,
        tree: CachedTree,
        min_match: int = 3,
        max_match: int = 8,
        refresh_every: int = 256,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tree = tree
        self.min_match, self.max_match = min_match, max_match
        self.refresh_every = refresh_every
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._snapshots: dict[str | None, _Snapshot] = {}
        self._size = -1
        self._queries = 0
        self._built_at = -float("inf")

    def continuation(
        self, suffix: np.ndarray, max_tokens: int, extra_key: str | None = None
    ) -> Continuation | None:
        suffix = np.asarray(suffix, dtype=np.int64)[-self.max_match :]
        if len(suffix) < self.min_match or max_tokens <= 0:
            return None
        snap = self._snapshot(extra_key)
        ends, agree = self._matches(snap, suffix)
        recency = np.array([snap.nodes[i].last_access_time for i in snap.owner[ends]], np.int64)
        for j in np.lexsort((-recency, -agree))[:_MAX_TRIES]:
            tokens = self._read(snap, int(ends[j]), max_tokens)
            if len(tokens):
                return Continuation(tokens, int(agree[j]))
        return None

    # ---- matching -------------------------------------------------------------------------

    def _matches(self, snap: _Snapshot, suffix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat positions where the suffix's last `min_match` tokens end inside a node's key,
        and how far back (up to `len(suffix)`) each agrees with the suffix."""
        flat, m = snap.flat, self.min_match
        want = gram_hashes(suffix[-m:], m)
        lo, hi = (
            np.searchsorted(snap.hashes, want[0]),
            np.searchsorted(snap.hashes, want[0], "right"),
        )
        ends = snap.ends[lo:hi][-_MAX_CANDIDATES:]
        ends = ends[snap.offset[ends] >= 0]  # in a path tail: the parent's segment has it
        back = ends[:, None] - np.arange(len(suffix))[None, :]  # [candidates, len(suffix)]
        same = (back >= 0) & (flat[np.maximum(back, 0)] == suffix[::-1][None, :])
        agree = np.cumprod(same, axis=1).sum(axis=1)  # hashes may collide: count exactly
        keep = agree >= m
        return ends[keep], agree[keep]

    def _read(self, snap: _Snapshot, end: int, max_tokens: int) -> np.ndarray:
        """The tokens after flat position `end`: the rest of its node's key, then down the most
        recently used child (the continuation a user most likely repeats)."""
        i = int(snap.owner[end])
        parts = [snap.keys[i][int(snap.offset[end]) + 1 :][:max_tokens]]
        got, node = len(parts[0]), snap.nodes[i]
        while got < max_tokens and node.children:
            node = max(node.children.values(), key=lambda c: c.last_access_time)
            parts.append(node.key[: max_tokens - got])
            got += len(parts[-1])
        return np.concatenate(parts).astype(np.int64)

    # ---- the snapshot -----------------------------------------------------------------------

    def _snapshot(self, extra_key: str | None) -> _Snapshot:
        self._queries += 1
        size, now = self.tree.total_size, self.clock()
        changed = size != self._size or self._queries > self.refresh_every
        if changed and now - self._built_at >= self.min_interval_s:
            self._snapshots.clear()
            self._size, self._queries, self._built_at = size, 0, now
        snap = self._snapshots.get(extra_key)
        if snap is None:
            snap = self._snapshots[extra_key] = self._build(extra_key)
        return snap

    def _build(self, extra_key: str | None) -> _Snapshot:
        width = self.max_match - 1
        flats: list[np.ndarray] = []
        owners: list[np.ndarray] = []
        offsets: list[np.ndarray] = []
        nodes: list[CachedNode] = []
        keys: list[np.ndarray] = []
        empty = np.zeros(0, dtype=np.int64)
        top = [c for c in self.tree.root.children.values() if c.extra_key == extra_key]
        stack = [(node, empty) for node in top]
        while stack:
            node, tail = stack.pop()
            key = np.asarray(node.key, dtype=np.int64)
            segment = np.concatenate([tail, key])
            flats += [segment, _SEPARATOR]
            owners.append(np.full(len(segment) + 1, len(nodes), dtype=np.int64))
            offsets.append(np.arange(-len(tail), len(key) + 1, dtype=np.int64))
            nodes.append(node)
            keys.append(key)
            child_tail = segment[max(len(segment) - width, 0) :] if width else empty
            stack.extend((child, child_tail) for child in node.children.values())
        if not nodes:
            return _Snapshot(empty, empty, empty, (), (), empty.astype(np.uint64), empty)
        flat = np.concatenate(flats)
        hashes = gram_hashes(flat, self.min_match)
        order = np.argsort(hashes, kind="stable")
        return _Snapshot(
            flat,
            np.concatenate(owners),
            np.concatenate(offsets),
            tuple(nodes),
            tuple(keys),
            hashes[order],
            order + self.min_match - 1,
        )
