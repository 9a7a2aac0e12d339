"""Radix tree over token ids whose values are KV slots: the prefix cache (RadixAttention).

Invariants (checked by `check_invariants`):
- every non-root node holds a non-empty key (int64 token ids) and as many slots; with
  `page_size > 1` both are whole pages and a child is found by its first page;
- children of the root are keyed by `(extra_key, first token/page)`, so keys in different
  namespaces never share a node; deeper children are keyed by the first token/page alone;
- `node.lock_ref` = locks taken on the node itself (`direct_locks`) + its children's `lock_ref`;
  a node with `lock_ref > 0` is *protected*, else *evictable*; only unlocked leaves are evicted;
- the tree owns the slots of every node: they are in neither the pool's free list nor a request.
Node identity is stable under splits: the new node is the upper half, so a lock held on the
lower half still covers the whole path.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from localradix.mem.evict_policy import get_policy
from localradix.mem.invariants import check_invariants
from localradix.mem.kv_pool import KVPool

__all__ = ["Divergence", "MatchResult", "RadixCache", "TreeNode", "check_invariants"]

_EMPTY = np.zeros(0, dtype=np.int64)


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
    # Inserted by a request that reused little of the cache (a one-off prompt), and not hit
    # since: such prefixes go first when a cached-token budget trims (`evict(cold_only=True)`).
    cold: bool = False

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


@dataclass
class _Walk:
    """Result of following a key down the tree: full nodes matched, then maybe a partial one."""

    node: TreeNode  # deepest fully matched node
    pos: int  # tokens matched through `node`
    parts: list[np.ndarray]  # slot runs of the fully matched nodes
    partial: TreeNode | None = None  # child matched only in part (needs a split)
    partial_len: int = 0


class RadixCache:
    """Prefix cache: `match_prefix` / `insert` / `lock` / `unlock` / `evict` (DESIGN §3)."""

    def __init__(
        self,
        pool: KVPool,
        page_size: int = 1,
        eviction_policy: str = "lru",
        disable: bool = False,
    ) -> None:
        if page_size != pool.page_size:
            raise ValueError(f"cache page_size {page_size} != pool page_size {pool.page_size}")
        self.pool = pool
        self.page_size = page_size
        self.disable = disable
        self.policy = get_policy(eviction_policy)
        self.hit_tokens = 0
        self.miss_tokens = 0
        self._ids = itertools.count()
        self._clock = 0
        self._init_tree()
        pool.set_evictor(self.evict, lambda: self._evictable_size)

    # ---- sizes and counters ----------------------------------------------------------------

    @property
    def evictable_size(self) -> int:
        """Cached tokens no request holds: reclaimable on demand."""
        return self._evictable_size

    @property
    def protected_size(self) -> int:
        """Cached tokens on a locked path (in use by running requests)."""
        return self._protected_size

    @property
    def evictable_cold_size(self) -> int:
        """Tokens that `evict(..., cold_only=True)` can free: unlocked cold leaves and the cold
        ancestors that only they hold up (see `TreeNode.cold`)."""
        seen: set[TreeNode] = set()
        for leaf in self._leaves:
            node: TreeNode | None = leaf
            while node is not None and node.cold and node not in seen and not node.lock_ref:
                if any(child not in seen for child in node.children.values()):
                    break
                seen.add(node)
                node = node.parent
        return sum(len(node.key) for node in seen)

    @property
    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def record_hit(self, hit_tokens: int, miss_tokens: int) -> None:
        """Count prompt tokens served from / missing in the cache (at admission, once)."""
        self.hit_tokens += hit_tokens
        self.miss_tokens += miss_tokens

    @property
    def hit_rate(self) -> float:
        seen = self.hit_tokens + self.miss_tokens
        return self.hit_tokens / seen if seen else 0.0

    # ---- the protocol ------------------------------------------------------------------------

    def match_prefix(
        self, key: Sequence[int] | np.ndarray, extra_key: str | None = None, count_hit: bool = True
    ) -> MatchResult:
        """Longest cached prefix of `key` (whole pages); splits a node the match ends inside.

        Stamps access time and (unless `count_hit` is False: a request re-finding what it just
        inserted) a hit on the matched path; takes no lock.
        """
        raw = _as_key(key)
        if self.disable:
            return self._empty_match(raw, "disabled")
        walk = self._walk(self._truncate(raw), extra_key, count_hit=count_hit)
        node, pos = walk.node, walk.pos
        if walk.partial is not None:
            node = self._split(walk.partial, walk.partial_len)
            self._touch(node, count_hit=count_hit, priority=None)
            walk.parts.append(node.value)
            pos += walk.partial_len
        indices = np.concatenate(walk.parts) if walk.parts else _EMPTY
        divergence = self._divergence(raw, pos, node, walk.partial, walk.partial_len, extra_key)
        return MatchResult(indices, node, pos, divergence)

    def insert(
        self,
        key: Sequence[int] | np.ndarray,
        indices: np.ndarray,
        extra_key: str | None = None,
        priority: int = 0,
        cold: bool = False,
    ) -> int:
        """Cache `key[:L]` → `indices[:L]` (L = whole pages); return the already-cached length.
        `cold`: the new tokens came from a request that reused little of the cache.

        The tree takes (a copy of) `indices[already:L]`; slots the caller holds for
        `[its_prefix:already]` are duplicates it must free, and it keeps `indices[L:]`.
        """
        key = self._truncate(_as_key(key))
        if self.disable or not key.size:
            return len(key)
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) < len(key):
            raise ValueError(f"insert: {len(key)} tokens but only {len(indices)} slots")
        walk = self._walk(key, extra_key, priority=priority)
        node, pos = walk.node, walk.pos
        if walk.partial is not None:
            if pos + walk.partial_len == len(key):
                return len(key)  # ends inside a node: nothing new, no need to split
            node = self._split(walk.partial, walk.partial_len)
            self._touch(node, count_hit=False, priority=priority)
            pos += walk.partial_len
        if pos < len(key):
            leaf = self._add_leaf(node, key[pos:].copy(), indices[pos : len(key)].copy(), extra_key)
            leaf.priority, leaf.cold = priority, cold
        return pos

    def lock(self, node: TreeNode) -> None:
        """Protect the path root→node from eviction (root excluded); pair with `unlock`."""
        if node is self.root:
            return
        if not self._attached(node):
            raise RuntimeError(f"lock on {node!r}, which was evicted: re-match before locking")
        node.direct_locks += 1
        while node is not self.root:
            if node.lock_ref == 0:
                self._move_size(node, to_protected=True)
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
                self._move_size(node, to_protected=False)
            node = node.parent  # type: ignore[assignment]

    def evict(self, n_tokens: int, cold_only: bool = False) -> int:
        """Free at least `n_tokens` (if possible) of unlocked leaves, by policy, to the pool;
        only cold ones (`TreeNode.cold`) with `cold_only`.

        A parent that becomes an unlocked leaf joins the candidates. Returns tokens freed.
        """
        if self.disable or n_tokens <= 0:
            return 0
        key = self.policy.key
        heap = [(key(leaf), leaf.id, leaf) for leaf in self._leaves if leaf.cold or not cold_only]
        heapq.heapify(heap)
        freed = 0
        while freed < n_tokens and heap:
            leaf = heapq.heappop(heap)[2]
            freed += len(leaf.key)
            parent = self._remove_leaf(leaf)
            if parent in self._leaves and (parent.cold or not cold_only):
                heapq.heappush(heap, (key(parent), parent.id, parent))
        return freed

    def reset(self) -> None:
        """Drop every cached prefix (slots back to the pool). Hit counters are kept."""
        if self._protected_size:
            raise RuntimeError(f"reset with {self._protected_size} locked tokens in the cache")
        values = [node.value for node in self.iter_nodes()]
        if values:
            self.pool.free(np.concatenate(values))
        self._init_tree()

    # ---- inspection ----------------------------------------------------------------------------

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every node except the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

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

    @property
    def leaves(self) -> frozenset[TreeNode]:
        """The eviction candidates: unlocked non-root nodes without children."""
        return frozenset(self._leaves)

    # ---- internals ---------------------------------------------------------------------------

    def _init_tree(self) -> None:
        self.root = TreeNode(next(self._ids), _EMPTY, _EMPTY, None, 0, 0)
        self._evictable_size = 0
        self._protected_size = 0
        self._leaves: set[TreeNode] = set()

    def _truncate(self, key: np.ndarray) -> np.ndarray:
        return key[: len(key) - len(key) % self.page_size] if self.page_size > 1 else key

    def _child_key(self, parent: TreeNode, key: np.ndarray, extra_key: str | None) -> Hashable:
        first = int(key[0]) if self.page_size == 1 else tuple(key[: self.page_size].tolist())
        return (extra_key, first) if parent is self.root else first

    def _walk(
        self,
        key: np.ndarray,
        extra_key: str | None,
        count_hit: bool = False,
        priority: int | None = None,
    ) -> _Walk:
        self._clock += 1
        walk = _Walk(self.root, 0, [])
        while walk.pos < len(key):
            rest = key[walk.pos :]
            child = walk.node.children.get(self._child_key(walk.node, rest, extra_key))
            if child is None:
                break
            n = self._common_len(child.key, rest)
            if n < len(child.key):
                walk.partial, walk.partial_len = child, n
                break
            self._touch(child, count_hit, priority)
            walk.parts.append(child.value)
            walk.node, walk.pos = child, walk.pos + n
        return walk

    def _touch(self, node: TreeNode, count_hit: bool, priority: int | None) -> None:
        node.last_access_time = self._clock
        if count_hit:
            node.hit_count += 1
            node.cold = False
        if priority is not None and priority > node.priority:
            node.priority = priority

    def _common_len(self, a: np.ndarray, b: np.ndarray) -> int:
        """Length of the common prefix of `a` and `b`, rounded down to whole pages."""
        m = min(len(a), len(b))
        n = _first_mismatch(a[:m], b[:m])
        return n - n % self.page_size

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after `n` tokens; the new upper node takes its place and stats."""
        parent = child.parent
        assert parent is not None
        upper = replace(child, id=next(self._ids), key=child.key[:n], value=child.value[:n])
        upper.children, upper.direct_locks = {}, 0
        parent.children[self._child_key(parent, child.key, child.extra_key)] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[self._child_key(upper, child.key, child.extra_key)] = child
        return upper

    def _add_leaf(
        self, parent: TreeNode, key: np.ndarray, value: np.ndarray, extra_key: str | None
    ) -> TreeNode:
        leaf = TreeNode(next(self._ids), key, value, parent, self._clock, self._clock, extra_key)
        parent.children[self._child_key(parent, key, leaf.extra_key)] = leaf
        self._evictable_size += len(key)
        self._leaves.discard(parent)
        self._leaves.add(leaf)
        return leaf

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        """Detach an unlocked leaf and free its slots; return its parent."""
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.lock_ref == 0
        del parent.children[self._child_key(parent, leaf.key, leaf.extra_key)]
        self._leaves.discard(leaf)
        self._evictable_size -= len(leaf.key)
        self.pool.free(leaf.value)
        if parent is not self.root and not parent.children and parent.lock_ref == 0:
            self._leaves.add(parent)
        return parent

    def _attached(self, node: TreeNode) -> bool:
        parent = node.parent
        if parent is None:
            return False
        return parent.children.get(self._child_key(parent, node.key, node.extra_key)) is node

    def _move_size(self, node: TreeNode, to_protected: bool) -> None:
        n = len(node.key) if to_protected else -len(node.key)
        self._protected_size += n
        self._evictable_size -= n
        if to_protected:
            self._leaves.discard(node)
        elif not node.children:
            self._leaves.add(node)

    def _empty_match(self, raw: np.ndarray, reason: str) -> MatchResult:
        divergence = Divergence(reason, 0, int(raw[0])) if raw.size else None
        return MatchResult(_EMPTY, self.root, 0, divergence)

    def _divergence(
        self,
        raw: np.ndarray,
        pos: int,
        last: TreeNode,
        partial: TreeNode | None,
        partial_len: int,
        extra_key: str | None,
    ) -> Divergence | None:
        """Explain why `raw[pos:]` missed: which cached node went another way, and where."""
        if pos == len(raw):
            return None
        rest = raw[pos:]
        other = partial if partial is not None else self._likeliest_child(last, extra_key)
        if other is not None:
            m = min(len(rest), len(other.key))
            j = _first_mismatch(other.key[:m], rest[:m])
            if j < m:
                return Divergence(
                    "mismatch", pos + j, int(rest[j]), int(other.key[j]), other, partial_len + j
                )
        reason = "partial_page" if len(rest) < self.page_size else "uncached"
        return Divergence(reason, pos, int(rest[0]))

    def _likeliest_child(self, node: TreeNode, extra_key: str | None) -> TreeNode | None:
        """The most recently used child in the namespace (the continuation a user expects)."""
        kids: Iterable[TreeNode] = node.children.values()
        if node is self.root:
            kids = [c for c in kids if c.extra_key == extra_key]
        return max(kids, key=lambda c: c.last_access_time, default=None)


def _as_key(key: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(key, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"a key is a 1-D sequence of token ids, got shape {arr.shape}")
    return arr


def _first_mismatch(a: np.ndarray, b: np.ndarray) -> int:
    """Index of the first differing element of equal-length `a` and `b` (their length if none)."""
    neq = a != b
    i = int(neq.argmax()) if len(neq) else 0
    return i if len(neq) and neq[i] else len(a)
