"""State snapshots at radix nodes, for models whose state is more than their tokens' KV.

A recurrent layer (Mamba, RWKV, the gated delta-net of Qwen3.5/3.6, LFM2's convolutions)
folds every token into one state that cannot be cut back to a prefix, so cached KV slots alone
cannot resume such a model in the middle of a cached path. A node may therefore hold an opaque
handle to the model's state at exactly its end position (the runner owns what the handle
names: a llama.cpp partial state blob, recurrent tensors). A request resumes from the deepest
node with a handle on its matched path.

Handles have a byte budget: past it, weak ones (taken on speculation, not where a request
branched or ended) and then the least recently used ones are dropped (their nodes stay
cached, they just stop being resume points). A handle dies with its node (eviction).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localradix.mem.radix_node import TreeNode


@dataclass(eq=False)
class SnapshotStore:
    budget: int  # bytes of snapshots kept at most
    release: Callable[[Any], None]  # the runner frees a handle it gave out
    sizes: dict[TreeNode, int] = field(default_factory=dict)  # node -> its handle's bytes
    weak: set[TreeNode] = field(default_factory=set)  # dropped before the others
    bytes: int = 0
    hits: int = 0  # requests resumed from a snapshot
    # Prompt tokens the tree held but a request could not resume into (no snapshot there): what
    # a model without recurrent state would have found cached on the same traffic, less the hits.
    unresumed: int = 0
    taken: int = 0  # snapshots attached since start

    @property
    def count(self) -> int:
        return len(self.sizes)

    def attach(self, node: TreeNode, handle: Any, nbytes: int, weak: bool = False) -> bool:
        """Keep `handle` (the state at the end of `node`); False (handle released) when the
        node already has one or the handle alone is over the budget."""
        if node.snapshot is not None or nbytes > self.budget:
            self.release(handle)
            return False
        node.snapshot = handle
        self.sizes[node] = nbytes
        self.bytes += nbytes
        self.taken += 1
        if weak:
            self.weak.add(node)
        self._trim(keep=node)
        return True

    def forget(self, node: TreeNode) -> None:
        """Drop `node`'s snapshot, if it has one (its node is evicted, or the budget is short)."""
        if node.snapshot is None:
            return
        self.release(node.snapshot)
        node.snapshot = None
        self.bytes -= self.sizes.pop(node)
        self.weak.discard(node)

    def forget_all(self) -> None:
        for node in list(self.sizes):
            self.forget(node)

    def _trim(self, keep: TreeNode) -> None:
        """Drop weak, then least recently used snapshots until the budget holds (never `keep`)."""
        if self.bytes <= self.budget:
            return
        for node in sorted(self.sizes, key=lambda n: (n not in self.weak, n.last_access_time)):
            if self.bytes <= self.budget:
                return
            if node is not keep:
                self.forget(node)
