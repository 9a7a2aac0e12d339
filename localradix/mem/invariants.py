"""One function that checks the memory invariants of a pool and its radix cache.

Tests call it after every operation; the scheduler calls it when idle. It raises
`AssertionError` with a message naming the broken rule (explicit raises, so `python -O` keeps
them). Cost is linear in cached tokens, so it is not for the hot loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from localradix.mem.kv_pool import KVPool
    from localradix.mem.radix_cache import RadixCache, TreeNode


def check_invariants(
    pool: KVPool, cache: RadixCache, *, idle: bool = False, owned: Iterable[np.ndarray] = ()
) -> None:
    """Raise AssertionError unless pool and cache agree.

    - the pool's free list and free mask agree;
    - tree shape: keys/values non-empty, equal length, whole pages, correctly keyed children;
    - every node's `lock_ref` == its own locks + its children's `lock_ref`;
    - `evictable` / `protected` sizes equal the unlocked / locked tokens; the leaf set is exact;
    - no slot in two places (free list, tree, each `owned` array), none is the dummy or foreign,
      and none leaked: `free + evictable + protected + owned == total`;
    - every pin is on an attached node that holds a lock for it;
    - `idle` ⇒ nothing is locked by requests (pins stay until their deadline): each node's
      own locks are its pin's, and the protected tokens are exactly the pinned ones.
    """
    _check_pool(pool)
    tree_slots = _check_tree(cache)
    owned_tokens = _check_ownership(pool, tree_slots, [np.asarray(o, np.int64) for o in owned])
    accounted = pool.available + cache.evictable_size + cache.protected_size + owned_tokens
    _require(
        accounted == pool.total,
        f"free {pool.available} + evictable {cache.evictable_size} + protected "
        f"{cache.protected_size} + owned {owned_tokens} = {accounted} != total {pool.total}",
    )
    _check_pins(cache)
    _check_snapshots(cache)
    if idle:
        _check_idle(cache)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def _check_pins(cache: RadixCache) -> None:
    for node in cache.pins:
        _require(cache.tree.attached(node), f"pinned {node!r} was evicted")
        _require(node.direct_locks >= 1, f"pinned {node!r} holds no lock for its pin")


def _check_snapshots(cache: RadixCache) -> None:
    """Snapshots sit on attached nodes, each counted once, within the byte budget."""
    store = cache.snapshots
    held = {n for n in cache.iter_nodes() if n.snapshot is not None}
    if store is None:
        _require(not held, f"snapshots on {len(held)} nodes of a cache that keeps none")
        return
    _require(held == set(store.sizes), "the snapshot store and the tree's snapshots disagree")
    _require(store.bytes == sum(store.sizes.values()), "snapshot bytes drifted")
    _require(store.weak <= set(store.sizes), "a weak snapshot the store does not hold")
    _require(store.bytes <= store.budget, f"snapshots {store.bytes} B over {store.budget} B")


def _check_idle(cache: RadixCache) -> None:
    held = [n for n in cache.iter_nodes() if n.direct_locks != (n in cache.pins)]
    _require(not held, f"idle, yet requests still lock {held[:4]} (a lock leaked)")
    pinned = cache.pinned_size
    _require(
        cache.protected_size == pinned,
        f"idle, yet {cache.protected_size} tokens are locked and only {pinned} pinned",
    )


def _check_pool(pool: KVPool) -> None:
    free_pages = pool._free[: pool._n_free]
    counts = np.bincount(free_pages, minlength=pool.num_pages + 1)
    _require(counts.max(initial=0) <= 1, "a page is on the pool's free list twice")
    disagree = np.flatnonzero((counts > 0) != pool._is_free)
    _require(not disagree.size, f"pool free list and free mask disagree on pages {disagree[:8]}")


def _check_tree(cache: RadixCache) -> np.ndarray:
    """Check shape, locks, sizes and leaves; return every slot the tree holds."""
    root = cache.root
    _require(len(root.key) == 0 and root.lock_ref == 0, "root must be empty and unlocked")
    sizes = [0, 0]  # evictable, protected
    leaves: set[TreeNode] = set()
    values = []
    for node in cache.iter_nodes():
        _check_node(cache, node)
        sizes[node.lock_ref > 0] += len(node.key)
        if not node.children and node.lock_ref == 0:
            leaves.add(node)
        values.append(node.value)
    _require(
        sizes == [cache.evictable_size, cache.protected_size],
        f"tree holds evictable/protected {sizes}, cache reports "
        f"{[cache.evictable_size, cache.protected_size]}",
    )
    _require(leaves == set(cache.leaves), "the cache's eviction-candidate set is stale")
    return np.concatenate(values) if values else np.zeros(0, np.int64)


def _check_node(cache: RadixCache, node: TreeNode) -> None:
    page, parent = cache.page_size, node.parent
    _require(
        parent is not None and cache.tree.attached(node), f"{node!r} is not its parent's child"
    )
    _require(
        0 < len(node.key) == len(node.value) and len(node.key) % page == 0,
        f"{node!r}: key/value lengths {len(node.key)}/{len(node.value)}, page {page}",
    )
    if parent is not None and parent is not cache.root:
        _require(node.extra_key == parent.extra_key, f"{node!r} crosses namespaces")
    below = sum(child.lock_ref for child in node.children.values())
    _require(
        node.direct_locks >= 0 and node.lock_ref == node.direct_locks + below,
        f"{node!r}: lock_ref {node.lock_ref} != own locks {node.direct_locks} + children {below}",
    )


def _check_ownership(pool: KVPool, tree_slots: np.ndarray, owned: list[np.ndarray]) -> int:
    """No slot or page in two places, none outside the pool, none leaked; return owned tokens."""
    sources = [pool.free_slots(), tree_slots, *owned]
    every = np.concatenate(sources)
    outside = every[(every < pool.page_size) | (every >= pool.num_slots)]
    _require(not outside.size, f"dummy or foreign slots in use: {outside[:8]}")
    twice = np.flatnonzero(np.bincount(every, minlength=pool.num_slots) > 1)
    _require(not twice.size, f"slots owned twice: {twice[:8]}")
    pages = [_pages_of(slots, pool.page_size) for slots in sources]
    holders = np.bincount(np.concatenate(pages), minlength=pool.num_pages + 1)[1:]
    shared = np.flatnonzero(holders > 1) + 1
    _require(not shared.size, f"pages {shared[:8]} are shared by two owners")
    leaked = np.flatnonzero(holders == 0) + 1
    _require(not leaked.size, f"{leaked.size} pages leaked (owned by nobody): {leaked[:8]}")
    return sum(len(p) for p in pages[2:]) * pool.page_size


def _pages_of(slots: np.ndarray, page_size: int) -> np.ndarray:
    """The distinct pages `slots` touch (slots are already known to be distinct)."""
    if page_size == 1:
        return slots
    pages = np.sort(slots // page_size)
    first = np.ones(len(pages), dtype=bool)
    first[1:] = pages[1:] != pages[:-1]
    return pages[first]
