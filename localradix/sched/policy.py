"""Waiting-queue ordering (fcfs / lpm / dfs-weight) and the prefill admission budget."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from localradix.mem.radix_node import MatchResult, TreeNode
from localradix.sched.request import Req

# Above this many waiting requests, matching every prompt each step costs more than it saves.
LPM_FALLBACK_QUEUE_LEN = 128
# A not-yet-cached prefix this long, shared with a request admitted in the same batch, defers the
# later request one round so it hits the cache instead of prefilling the same tokens twice.
IN_BATCH_DEDUP_MIN_TOKENS = 32


def order_waiting(waiting: list[Req], policy: str, match: Callable[[Req], Any]) -> list[Req]:
    """Return `waiting` in admission order. `match(req)` refreshes `req.hold.prefix_match`."""
    if policy == "fcfs" or len(waiting) > LPM_FALLBACK_QUEUE_LEN:
        return list(waiting)
    for req in waiting:
        match(req)
    if policy == "lpm":
        return sorted(waiting, key=lambda r: -_match_of(r).matched_len)  # stable: fcfs ties
    if policy == "dfs-weight":
        return _dfs_weight_order(waiting)
    raise ValueError(f"unknown schedule policy {policy!r}")


def _match_of(req: Req) -> MatchResult:
    match = req.hold.prefix_match
    assert match is not None  # `match(req)` just refreshed it
    return match


def _dfs_weight_order(waiting: list[Req]) -> list[Req]:
    """Visit the radix tree depth-first, heavier subtrees (more waiting requests) first."""
    by_node: dict[int, list[Req]] = defaultdict(list)
    weight: dict[int, int] = defaultdict(int)
    nodes: dict[int, Any] = {}
    children: dict[int, list[Any]] = defaultdict(list)
    for req in waiting:
        node: TreeNode | None = _match_of(req).last_node
        by_node[id(node)].append(req)
        while node is not None:
            nodes[id(node)] = node
            weight[id(node)] += 1
            parent = getattr(node, "parent", None)
            if parent is not None and node not in children[id(parent)]:
                children[id(parent)].append(node)
            node = parent
    roots = [n for n in nodes.values() if getattr(n, "parent", None) is None]
    order: list[Req] = []
    stack = list(roots)
    while stack:
        node = stack.pop()
        order.extend(by_node.get(id(node), ()))
        kids = sorted(children.get(id(node), ()), key=lambda n: weight[id(n)])
        stack.extend(kids)  # heaviest is popped first
    return order


class PrefillBudget:
    """Tracks how many new tokens the next prefill batch may take.

    The budget is `free + evictable - reserved`, where `reserved` is each admitted or running
    request's remaining max_tokens scaled by `new_token_ratio`: room they will likely need to
    decode. The ratio decays while decoding goes fine and resets after a retraction.
    """

    def __init__(
        self,
        available: int,
        reserved: float,
        max_prefill_tokens: int,
        chunk_size: int,
        new_token_ratio: float,
    ) -> None:
        self.room = available - reserved
        self.prefill_left = max_prefill_tokens
        self.chunk_size = chunk_size
        self.ratio = new_token_ratio
        self.admitted: list[Req] = []
        self.admitted_keys: list[np.ndarray] = []

    def extend_size(self, req: Req, todo: int) -> int:
        """How many of `todo` uncached tokens `req` may prefill now (0 = not admissible)."""
        limit = min(self.prefill_left, todo)
        if self.chunk_size > 0:
            limit = min(limit, self.chunk_size)
        need = limit + (req.remaining_new_tokens * self.ratio if limit == todo else 0)
        if limit <= 0 or need > self.room:
            return 0
        return limit

    def take(self, req: Req, extend: int, key: np.ndarray, *, finishes_prompt: bool) -> None:
        self.room -= extend + (req.remaining_new_tokens * self.ratio if finishes_prompt else 0)
        self.prefill_left -= extend
        self.admitted.append(req)
        self.admitted_keys.append(key)

    def shares_new_prefix(self, key: np.ndarray, cached_len: int) -> bool:
        """True if an already-admitted request will cache a long stretch of `key` this step."""
        for other in self.admitted_keys:
            n = min(len(key), len(other))
            diff = np.flatnonzero(key[:n] != other[:n])
            common = int(diff[0]) if len(diff) else n
            if common - cached_len >= IN_BATCH_DEDUP_MIN_TOKENS:
                return True
        return False
