"""The radix tree's shape: walking a key down it, splitting nodes, adding and removing leaves,
and the tree's own accounting (evictable / protected tokens, the unlocked leaves).

It knows nothing of the KV pool or of eviction order; `RadixCache` builds the prefix-cache
protocol on top of it. Node identity is stable under splits: the new node is the upper half,
so a lock held on the lower half still covers the whole path.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from localradix.mem.radix_node import EMPTY, Divergence, TreeNode, first_mismatch


@dataclass
class Walk:
    """Result of following a key down the tree: full nodes matched, then maybe a partial one."""

    node: TreeNode  # deepest fully matched node
    pos: int  # tokens matched through `node`
    parts: list[np.ndarray]  # slot runs of the fully matched nodes
    partial: TreeNode | None = None  # child matched only in part (needs a split)
    partial_len: int = 0


class RadixTree:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._ids = itertools.count()
        self.clock = 0  # bumped by every walk: the nodes' access times
        self.reset()

    def reset(self) -> None:
        """An empty tree (the caller frees the old nodes' slots)."""
        self.root = TreeNode(next(self._ids), EMPTY, EMPTY, None, 0, 0)
        self.evictable = 0  # tokens on unlocked nodes
        self.protected = 0  # tokens on locked paths
        self.leaves: set[TreeNode] = set()  # unlocked nodes without children

    def truncate(self, key: np.ndarray) -> np.ndarray:
        """`key` cut to whole pages."""
        return key[: len(key) - len(key) % self.page_size] if self.page_size > 1 else key

    def child_key(self, parent: TreeNode, key: np.ndarray, extra_key: str | None) -> Hashable:
        """How `parent` finds the child starting with `key`: its first token (or page), and
        under the root the namespace too."""
        first = int(key[0]) if self.page_size == 1 else tuple(key[: self.page_size].tolist())
        return (extra_key, first) if parent is self.root else first

    def walk(
        self,
        key: np.ndarray,
        extra_key: str | None,
        count_hit: bool = False,
        priority: int | None = None,
    ) -> Walk:
        """Follow `key` (whole pages) down from the root, stamping each fully matched node."""
        self.clock += 1
        walk = Walk(self.root, 0, [])
        while walk.pos < len(key):
            rest = key[walk.pos :]
            child = walk.node.children.get(self.child_key(walk.node, rest, extra_key))
            if child is None:
                break
            n = self._common_len(child.key, rest)
            if n < len(child.key):
                walk.partial, walk.partial_len = child, n
                break
            self.touch(child, count_hit, priority)
            walk.parts.append(child.value)
            walk.node, walk.pos = child, walk.pos + n
        return walk

    def touch(self, node: TreeNode, count_hit: bool, priority: int | None) -> None:
        """Stamp an access (and a hit, which warms a cold node; and a priority raise)."""
        node.last_access_time = self.clock
        if count_hit:
            node.hit_count += 1
            node.cold_from = math.inf
        if priority is not None and priority > node.priority:
            node.priority = priority

    def _common_len(self, a: np.ndarray, b: np.ndarray) -> int:
        """Length of the common prefix of `a` and `b`, rounded down to whole pages."""
        m = min(len(a), len(b))
        n = first_mismatch(a[:m], b[:m])
        return n - n % self.page_size

    def split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after `n` tokens; the new upper node takes its place and stats."""
        parent = child.parent
        assert parent is not None
        upper = replace(child, id=next(self._ids), key=child.key[:n], value=child.value[:n])
        # A snapshot is the state at the end of a node's key: it stays with the lower half.
        upper.children, upper.direct_locks, upper.snapshot = {}, 0, None
        parent.children[self.child_key(parent, child.key, child.extra_key)] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[self.child_key(upper, child.key, child.extra_key)] = child
        return upper

    def add_leaf(
        self, parent: TreeNode, key: np.ndarray, value: np.ndarray, extra_key: str | None
    ) -> TreeNode:
        leaf = TreeNode(next(self._ids), key, value, parent, self.clock, self.clock, extra_key)
        parent.children[self.child_key(parent, key, leaf.extra_key)] = leaf
        self.evictable += len(key)
        self.leaves.discard(parent)
        self.leaves.add(leaf)
        return leaf

    def remove_leaf(self, leaf: TreeNode) -> TreeNode:
        """Detach an unlocked leaf (the caller frees its slots); return its parent."""
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.lock_ref == 0
        del parent.children[self.child_key(parent, leaf.key, leaf.extra_key)]
        self.leaves.discard(leaf)
        self.evictable -= len(leaf.key)
        if parent is not self.root and not parent.children and parent.lock_ref == 0:
            self.leaves.add(parent)
        return parent

    def attached(self, node: TreeNode) -> bool:
        """Whether `node` is still in the tree (not evicted)."""
        parent = node.parent
        if parent is None:
            return False
        return parent.children.get(self.child_key(parent, node.key, node.extra_key)) is node

    def move_size(self, node: TreeNode, to_protected: bool) -> None:
        """A node's lock count went 0 -> 1 (`to_protected`) or 1 -> 0: move its tokens."""
        n = len(node.key) if to_protected else -len(node.key)
        self.protected += n
        self.evictable -= n
        if to_protected:
            self.leaves.discard(node)
        elif not node.children:
            self.leaves.add(node)

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every node except the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def explain_miss(self, raw: np.ndarray, walk: Walk, extra_key: str | None) -> Divergence | None:
        """Why `raw` left the cache after the walk matched it (None if all of it matched):
        which cached node went another way, and where."""
        pos = walk.pos + walk.partial_len
        if pos == len(raw):
            return None
        rest = raw[pos:]
        other = walk.partial if walk.partial is not None else self._likeliest_child(walk, extra_key)
        if other is not None:
            m = min(len(rest), len(other.key))
            j = first_mismatch(other.key[:m], rest[:m])
            if j < m:
                offset = walk.partial_len + j
                return Divergence(
                    "mismatch", pos + j, int(rest[j]), int(other.key[j]), other, offset
                )
        reason = "partial_page" if len(rest) < self.page_size else "uncached"
        return Divergence(reason, pos, int(rest[0]))

    def _likeliest_child(self, walk: Walk, extra_key: str | None) -> TreeNode | None:
        """The most recently used child in the namespace (the continuation a user expects)."""
        kids: Iterable[TreeNode] = walk.node.children.values()
        if walk.node is self.root:
            kids = [c for c in kids if c.extra_key == extra_key]
        return max(kids, key=lambda c: c.last_access_time, default=None)
