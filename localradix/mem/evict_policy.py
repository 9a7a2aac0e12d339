"""Eviction policies for the radix cache: which unlocked leaf goes first.

A policy maps a leaf to a sort key; the cache pops the *smallest* key first from a heap of the
evictable leaves (ties broken by node id, i.e. creation order). Policies read only the node's
statistics, so they hold no state and are shared singletons in `POLICIES`.
"""

from __future__ import annotations

from typing import Protocol


class NodeStats(Protocol):
    """What a policy may read from a tree node. Times are the cache's logical clock ticks."""

    last_access_time: int
    hit_count: int
    creation_time: int
    priority: int


class EvictionPolicy(Protocol):
    name: str

    def key(self, node: NodeStats) -> tuple[int, ...]:
        """Sort key; the leaf with the smallest key is evicted first."""
        ...


class LRU:
    """Least recently used (matched or inserted) first."""

    name = "lru"

    def key(self, node: NodeStats) -> tuple[int, ...]:
        return (node.last_access_time,)


class LFU:
    """Fewest prefix hits first; among equals, least recently used."""

    name = "lfu"

    def key(self, node: NodeStats) -> tuple[int, ...]:
        return (node.hit_count, node.last_access_time)


class FIFO:
    """Oldest inserted first, however often it is used."""

    name = "fifo"

    def key(self, node: NodeStats) -> tuple[int, ...]:
        return (node.creation_time,)


class Priority:
    """Lowest request priority first; among equals, least recently used."""

    name = "priority"

    def key(self, node: NodeStats) -> tuple[int, ...]:
        return (node.priority, node.last_access_time)


POLICIES: dict[str, EvictionPolicy] = {p.name: p for p in (LRU(), LFU(), FIFO(), Priority())}


def get_policy(name: str) -> EvictionPolicy:
    """The policy registered under `name`; ValueError lists the choices otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose one of {sorted(POLICIES)}"
        ) from None
