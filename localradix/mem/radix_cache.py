"""Radix tree over token ids whose values are KV slots: the prefix cache (RadixAttention).

Invariants (checked by `check_invariants`):
- every non-root node holds a non-empty key (int64 token ids) and as many slots; with
  `page_size > 1` both are whole pages and a child is found by its first page;
- children of the root are keyed by `(extra_key, first token/page)`, so keys in different
  namespaces never share a node; deeper children are keyed by the first token/page alone;
- `node.lock_ref` = locks taken on the node itself (`direct_locks`) + its children's `lock_ref`;
  a node with `lock_ref > 0` is *protected*, else *evictable*; only unlocked leaves are evicted;
- a *pin* (`pin`, Anthropic's cache_control) is one lock the cache itself holds on a node until
  a deadline, so pinned tokens are protected; requests' locks and pins are told apart by
  `pins` (idle: each node's `direct_locks` is 1 if it is pinned, else 0);
- the tree owns the slots of every node: they are in neither the pool's free list nor a request.

The tree's shape and accounting live in `radix_tree.py`, its node and match types in
`radix_node.py`; this class is the protocol over a KV pool: match, insert, lock, evict.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from localradix.mem.evict_policy import get_policy
from localradix.mem.invariants import check_invariants
from localradix.mem.kv_pool import KVPool
from localradix.mem.radix_node import EMPTY, Divergence, MatchResult, TreeNode, as_key
from localradix.mem.radix_tree import RadixTree
from localradix.mem.snapshot_store import SnapshotStore

__all__ = ["Divergence", "MatchResult", "RadixCache", "TreeNode", "check_invariants"]


class RadixCache:
    """Prefix cache: `match_prefix` / `insert` / `lock` / `unlock` / `evict` (docs/architecture.md, "Radix tree")."""

    def __init__(
        self,
        pool: KVPool,
        page_size: int = 1,
        eviction_policy: str = "lru",
        disable: bool = False,
        snapshots: SnapshotStore | None = None,
    ) -> None:
        if page_size != pool.page_size:
            raise ValueError(f"cache page_size {page_size} != pool page_size {pool.page_size}")
        self.pool = pool
        self.page_size = page_size
        self.disable = disable
        self.policy = get_policy(eviction_policy)
        self.tree = RadixTree(page_size)
        # Set for models that resume only where a state snapshot was taken (recurrent layers).
        self.snapshots = snapshots
        # Pinned node -> deadline, on the caller's clock (the scheduler's monotonic one).
        self.pins: dict[TreeNode, float] = {}
        # Told of every leaf just before eviction frees it: the tiers below keep its KV.
        self.on_evict: Callable[[TreeNode], None] | None = None
        pool.set_evictor(self.evict, lambda: self.tree.evictable)

    # ---- sizes -------------------------------------------------------------------------------

    @property
    def root(self) -> TreeNode:
        return self.tree.root

    @property
    def evictable_size(self) -> int:
        """Cached tokens no request holds: reclaimable on demand."""
        return self.tree.evictable

    @property
    def protected_size(self) -> int:
        """Cached tokens on a locked path (in use by running requests)."""
        return self.tree.protected

    @property
    def pinned_size(self) -> int:
        """Cached tokens on a pinned path (protected until their pins expire)."""
        return sum(len(node.key) for node in self._pinned_paths())

    @property
    def total_size(self) -> int:
        return self.tree.evictable + self.tree.protected

    @property
    def leaves(self) -> frozenset[TreeNode]:
        """The eviction candidates: unlocked non-root nodes without children."""
        return frozenset(self.tree.leaves)

    # ---- the protocol ------------------------------------------------------------------------

    def match_prefix(
        self, key: Sequence[int] | np.ndarray, extra_key: str | None = None, count_hit: bool = True
    ) -> MatchResult:
        """Longest cached prefix of `key` (whole pages); splits a node the match ends inside.

        Stamps access time and (unless `count_hit` is False: a request re-finding what it just
        inserted) a hit on the matched path; takes no lock.
        """
        raw = as_key(key)
        if self.disable:
            divergence = Divergence("disabled", 0, int(raw[0])) if raw.size else None
            return MatchResult(EMPTY, self.root, 0, divergence)
        walk = self.tree.walk(self.tree.truncate(raw), extra_key, count_hit=count_hit)
        node = walk.node
        if walk.partial is not None:
            node = self.tree.split(walk.partial, walk.partial_len)
            self.tree.touch(node, count_hit=count_hit, priority=None)
            walk.parts.append(node.value)
        indices = np.concatenate(walk.parts) if walk.parts else EMPTY
        divergence = self.tree.explain_miss(raw, walk, extra_key)
        return MatchResult(indices, node, walk.pos + walk.partial_len, divergence)

    def resume_point(self, match: MatchResult) -> MatchResult:
        """`match` cut back to the deepest node on its path that holds a state snapshot (the
        root when none does): where a model with recurrent state can resume. Unchanged when
        the cache keeps no snapshots."""
        if self.snapshots is None:
            return match
        node, depth = match.last_node, match.matched_len
        while node is not self.root and node.snapshot is None:
            depth -= len(node.key)
            node = node.parent  # type: ignore[assignment]  # non-root nodes have a parent
        if node is match.last_node:
            return match
        return MatchResult(match.indices[:depth], node, depth, match.divergence)

    def insert(
        self,
        key: Sequence[int] | np.ndarray,
        indices: np.ndarray,
        extra_key: str | None = None,
        priority: int = 0,
        cold_from: float = math.inf,
    ) -> int:
        """Cache `key[:L]` → `indices[:L]` (L = whole pages); return the already-cached length.
        `cold_from`: when the new tokens turn cold (`TreeNode.cold_from`; inf: never).

        The tree takes (a copy of) `indices[already:L]`; slots the caller holds for
        `[its_prefix:already]` are duplicates it must free, and it keeps `indices[L:]`.
        """
        key = self.tree.truncate(as_key(key))
        if self.disable or not key.size:
            return len(key)
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) < len(key):
            raise ValueError(f"insert: {len(key)} tokens but only {len(indices)} slots")
        walk = self.tree.walk(key, extra_key, priority=priority)
        node, pos = walk.node, walk.pos
        if walk.partial is not None:
            if pos + walk.partial_len == len(key):
                return len(key)  # ends inside a node: nothing new, no need to split
            node = self.tree.split(walk.partial, walk.partial_len)
            self.tree.touch(node, count_hit=False, priority=priority)
            pos += walk.partial_len
        if pos < len(key):
            value = indices[pos : len(key)].copy()
            leaf = self.tree.add_leaf(node, key[pos:].copy(), value, extra_key)
            leaf.priority, leaf.cold_from = priority, cold_from
        return pos

    def lock(self, node: TreeNode) -> None:
        """Protect the path root→node from eviction (root excluded); pair with `unlock`."""
        if node is self.root:
            return
        if not self.tree.attached(node):
            raise RuntimeError(f"lock on {node!r}, which was evicted: re-match before locking")
        node.direct_locks += 1
        while node is not self.root:
            if node.lock_ref == 0:
                self.tree.move_size(node, to_protected=True)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]  # non-root nodes have a parent

    def unlock(self, node: TreeNode) -> None:
        """Release one `lock(node)`; raises if the node holds no lock of its own."""
        if node is self.root:
            return
        if node.direct_locks <= 0:
            raise RuntimeError(f"unlock of {node!r} without a matching lock")
        node.direct_locks -= 1
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.tree.move_size(node, to_protected=False)
            node = node.parent  # type: ignore[assignment]

    def evict(self, n_tokens: int, cold_at: float = math.inf) -> int:
        """Free at least `n_tokens` (if possible) of unlocked leaves, by policy, to the pool:
        those cold by `cold_at` (`TreeNode.cold_from <= cold_at`; every leaf by default).

        A parent that becomes an unlocked leaf joins the candidates. Returns tokens freed.
        """
        if self.disable or n_tokens <= 0:
            return 0
        key = self.policy.key
        leaves = self.tree.leaves
        heap = [(key(leaf), leaf.id, leaf) for leaf in leaves if leaf.cold_from <= cold_at]
        heapq.heapify(heap)
        freed = 0
        while freed < n_tokens and heap:
            leaf = heapq.heappop(heap)[2]
            freed += len(leaf.key)
            if self.on_evict is not None:
                self.on_evict(leaf)
            parent = self.tree.remove_leaf(leaf)
            if self.snapshots is not None:
                self.snapshots.forget(leaf)
            self.pool.free(leaf.value)
            if parent in leaves and parent.cold_from <= cold_at:
                heapq.heappush(heap, (key(parent), parent.id, parent))
        return freed

    # ---- pins ------------------------------------------------------------------------------

    def pin(
        self,
        key: Sequence[int] | np.ndarray,
        deadline: float,
        extra_key: str | None = None,
        budget: int | None = None,
    ) -> int:
        """Keep the cached prefix of `key` (whole pages) until `deadline`; return its length.

        Pinning a pinned prefix again renews it (the later deadline wins). With `budget`, the
        pin is clipped to the longest cached prefix (whole pages) that keeps `pinned_size <=
        budget` (0: none).
        """
        if self.disable:
            return 0
        match = self.match_prefix(key, extra_key, count_hit=False)
        node, length = self._within_budget(match.last_node, match.matched_len, budget)
        if node is self.root:
            return 0
        if node in self.pins:
            self.pins[node] = max(self.pins[node], deadline)
        else:
            self.lock(node)
            self.pins[node] = deadline
        return length

    def unpin_expired(self, now: float) -> int:
        """Drop the pins whose deadline is past (their tokens become evictable if no request
        holds them); return how many were dropped."""
        expired = [node for node, deadline in self.pins.items() if deadline <= now]
        for node in expired:
            del self.pins[node]
            self.unlock(node)
        return len(expired)

    def unpin_all(self) -> None:
        """Drop every pin (a cache flush)."""
        for node in list(self.pins):
            del self.pins[node]
            self.unlock(node)

    def _pinned_paths(self) -> set[TreeNode]:
        """Every node on a root-to-pin path (root excluded)."""
        seen: set[TreeNode] = set()
        for pinned in self.pins:
            node: TreeNode = pinned
            while node is not self.root and node not in seen:
                seen.add(node)
                node = node.parent  # type: ignore[assignment]  # non-root nodes have a parent
        return seen

    def _within_budget(
        self, last: TreeNode, length: int, budget: int | None
    ) -> tuple[TreeNode, int]:
        """The deepest node on the path root->`last` that a pin may take within `budget`
        pinned tokens (a node the budget ends inside is split there, on a page boundary), and
        its depth (the root and 0 when nothing fits)."""
        if budget is None:
            return last, length
        path: list[TreeNode] = []
        node = last
        while node is not self.root:
            path.append(node)
            node = node.parent  # type: ignore[assignment]
        covered = self._pinned_paths()
        room = budget - sum(len(n.key) for n in covered)
        best, depth = self.root, 0
        for node in reversed(path):
            size = 0 if node in covered else len(node.key)
            if size > room:
                cut = room - room % self.page_size
                return (self.tree.split(node, cut), depth + cut) if cut > 0 else (best, depth)
            room -= size
            best, depth = node, depth + len(node.key)
        return best, depth

    def evictable_cold_size(self, now: float) -> int:
        """Tokens that `evict(..., cold_at=now)` can free: unlocked leaves cold by `now` and the
        cold ancestors that only they hold up (see `TreeNode.cold_from`)."""
        seen: set[TreeNode] = set()
        for leaf in self.tree.leaves:
            node: TreeNode | None = leaf
            while (
                node is not None
                and node.cold_from <= now
                and node not in seen
                and not node.lock_ref
            ):
                if any(child not in seen for child in node.children.values()):
                    break
                seen.add(node)
                node = node.parent
        return sum(len(node.key) for node in seen)

    def reset(self) -> None:
        """Drop every cached prefix, pinned ones too (slots back to the pool)."""
        held = [n for n in self.iter_nodes() if n.direct_locks > (n in self.pins)]
        if held:
            raise RuntimeError(f"reset while requests hold {len(held)} locked nodes")
        self.unpin_all()
        if self.snapshots is not None:
            self.snapshots.forget_all()
        values = [node.value for node in self.iter_nodes()]
        if values:
            self.pool.free(np.concatenate(values))
        self.tree.reset()

    # ---- inspection ----------------------------------------------------------------------------

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every node except the root, parents before children."""
        return self.tree.iter_nodes()

    def leaf_paths(self) -> list[tuple[np.ndarray, np.ndarray, str | None]]:
        """(tokens, slots, extra_key) of every root-to-leaf path: all that is cached."""
        leaves = (node for node in self.iter_nodes() if not node.children)
        return [(*self.path_of(node), node.extra_key) for node in leaves]

    def snapshot_paths(self) -> list[tuple[np.ndarray, str | None, Any]]:
        """(tokens, extra_key, snapshot handle) of every node holding a state snapshot."""
        return [
            (self.path_of(node)[0], node.extra_key, node.snapshot)
            for node in self.iter_nodes()
            if node.snapshot is not None
        ]

    def path_of(self, node: TreeNode) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, slots) from the root to the end of `node`."""
        keys, values, up = [], [], node
        while up is not self.root:
            keys.append(up.key)
            values.append(up.value)
            up = up.parent  # type: ignore[assignment]  # non-root nodes have a parent
        return np.concatenate(keys[::-1]), np.concatenate(values[::-1])

    def top_prefixes(self, k: int, head_tokens: int = 8) -> list[dict[str, Any]]:
        """The `k` cached prefixes that saved the most prefill (hits x length), for the TUI.

        Every node ends a prefix (root to that node), so a shared system prompt shows up on its
        own, with the hits of the requests that went through it. Linear in the number of nodes.
        """
        entries: list[tuple[int, int, TreeNode, TreeNode]] = []  # (saved, tokens, node, top)
        stack = [(child, len(child.key), child) for child in self.root.children.values()]
        while stack:
            node, depth, top = stack.pop()
            entries.append((node.hit_count * depth, depth, node, top))
            stack.extend((c, depth + len(c.key), top) for c in node.children.values())
        best = heapq.nlargest(k, entries, key=lambda e: (e[0], e[1], -e[2].id))
        return [
            {
                "tokens": depth,
                "hits": node.hit_count,
                "saved_tokens": saved,
                "locked": node.lock_ref > 0,
                "leaf": not node.children,
                "extra_key": node.extra_key,
                "head": top.key[:head_tokens].tolist(),
            }
            for saved, depth, node, top in best
        ]
