"""The radix tree's data: a node (a run of tokens and their KV slots), and what a match returns
(the cached prefix and, on a miss, where and why the request left the cache)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(eq=False, repr=False, slots=True)
class TreeNode:
    """One edge of the radix tree: a run of tokens and their KV slots. Hashed by identity."""

    id: int
    key: np.ndarray  # int64 token ids
    value: np.ndarray  # int64 KV slots, same length
    parent: TreeNode | None
    creation_time: int
    last_access_time: int
    extra_key: str | None = None
    children: dict[Hashable, TreeNode] = field(default_factory=dict)
    lock_ref: int = 0  # locks on this node or below it
    direct_locks: int = 0  # locks taken on exactly this node
    hit_count: int = 0
    priority: int = 0
    # When, on the caller's clock, the node turns cold: inserted by a request that reused
    # little of the cache (a one-off prompt) and not hit since. Cold prefixes go first when a
    # cached-token budget trims (`evict(cold_at=now)`). inf: warm (a hit also warms).
    cold_from: float = math.inf
    # The model's state at this node's end, for models whose state is more than the KV of
    # their tokens (recurrent layers): an opaque runner handle (`SnapshotStore`), or None.
    snapshot: Any = None

    def __repr__(self) -> str:
        head = self.key[:4].tolist()
        return f"TreeNode(id={self.id}, len={len(self.key)}, head={head}, lock_ref={self.lock_ref})"


@dataclass(frozen=True)
class Divergence:
    """Where a request left the cache, so the server and TUI can explain a (partial) miss.

    reason: "mismatch" (the cache continues with another token), "uncached" (nothing cached
    continues here), "partial_page" (fewer than `page_size` tokens remained), "disabled".
    """

    reason: str
    position: int  # index in the request of the first token that differs / is not cached
    request_token: int
    cached_token: int | None = None  # what the cache holds at `position` ("mismatch" only)
    node: TreeNode | None = None  # the cached node that continues differently ("mismatch" only)
    node_offset: int = 0  # tokens of that node's original segment the request did match

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (no node object) for stats feeds."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "node"}


@dataclass(frozen=True)
class MatchResult:
    """The cached prefix of a key: its slots, the node it ends at, and where it diverged.

    `divergence` is None when the whole key is cached. `last_node` ends exactly at `matched_len`.
    """

    indices: np.ndarray  # int64 slots, len == matched_len
    last_node: TreeNode
    matched_len: int
    divergence: Divergence | None = None


def as_key(key: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(key, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"a key is a 1-D sequence of token ids, got shape {arr.shape}")
    return arr


def first_mismatch(a: np.ndarray, b: np.ndarray) -> int:
    """Index of the first differing element of equal-length `a` and `b` (their length if none)."""
    neq = a != b
    i = int(neq.argmax()) if len(neq) else 0
    return i if len(neq) and neq[i] else len(a)
