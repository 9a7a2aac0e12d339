"""TorchKVTransfer: a torch runner's KV slots to host bytes and back (for the cache tiers).

Every torch attention backend keeps K and V as `[layers, slots + 1, kv_heads, head_dim]` (the
paged ones as `[layers, pages, page_size, ...]`, the same memory). A token's KV leaves as one
row of bytes: its K for every layer, then its V, so the tiers below the radix tree store and
slice KV token by token without knowing the dtype. The bytes cross between device and host
through `kv_copy.py`: on CUDA asynchronously, through pinned memory.

KV layers of mixed shapes (`KVLayout.layer_shapes`, Gemma 4) live in one such pair of tensors
per shape (`allocate_kv`); a token's row is then each group's K then V, in group order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from localradix.model_api.kv_layout import KVLayout
from localradix.runner.kv_copy import HostCopies, HostRows, copies_for

KVGroup = tuple[torch.Tensor, torch.Tensor]  # K and V [layers, slots + 1, kv_heads, head_dim]
LayerCaches = torch.Tensor | list[torch.Tensor]  # indexed by KV layer: [slots + 1, heads, dim]


def allocate_kv(layout: KVLayout, dtype: torch.dtype, device: torch.device | str) -> list[KVGroup]:
    """Zeroed K and V for each distinct layer shape of `layout` (one pair when uniform)."""
    groups = []
    for heads, dim, layers in layout.groups:
        shape = (len(layers), layout.slots + 1, heads, dim)
        k = torch.zeros(shape, dtype=dtype, device=device)
        groups.append((k, torch.zeros_like(k)))
    return groups


def layer_caches(layout: KVLayout, groups: Sequence[KVGroup]) -> tuple[LayerCaches, LayerCaches]:
    """(k_cache, v_cache) indexed by KV layer: the one group's tensors when uniform, else lists
    of per-layer views into the groups."""
    if layout.uniform:
        return groups[0]
    place = {
        layer: (g, i) for g, (_, _, ls) in enumerate(layout.groups) for i, layer in enumerate(ls)
    }
    order = [place[layer] for layer in range(layout.layers)]
    return [groups[g][0][i] for g, i in order], [groups[g][1][i] for g, i in order]


class TorchKVTransfer:
    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        *more: KVGroup,
        copies: HostCopies | None = None,
    ) -> None:
        self.groups = [
            (self._slot_major(k), self._slot_major(v)) for k, v in ((k_cache, v_cache), *more)
        ]
        self.copies = copies if copies is not None else copies_for(k_cache.device)
        self.halves = [
            k.shape[0] * k.shape[2] * k.shape[3] * k.element_size() for k, _ in self.groups
        ]
        self.bytes_per_token = 2 * sum(self.halves)

    @staticmethod
    def _slot_major(cache: torch.Tensor) -> torch.Tensor:
        layers, heads, dim = cache.shape[0], cache.shape[-2], cache.shape[-1]
        return cache.view(layers, -1, heads, dim)  # slot-major whatever the paging

    @property
    def device(self) -> torch.device:
        return self.groups[0][0].device

    def read(self, slots: np.ndarray) -> np.ndarray:
        return self.read_async(slots).result()

    def read_async(self, slots: np.ndarray) -> HostRows:
        """Start copying the slots' rows out: the slots may be reused as soon as this returns
        (the rows are gathered first); the bytes are the handle's `result()`."""
        return self.copies.to_host(self.rows(slots))

    def write(self, prefix: np.ndarray, slots: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        done = 0
        for part in parts:  # chunk by chunk: the next is staged while this one copies
            rows = self.copies.to_device(np.ascontiguousarray(part, dtype=np.uint8), self.device)
            self.put_rows(slots[done : done + len(part)], rows)
            done += len(part)

    @torch.no_grad()
    def rows(self, slots: np.ndarray) -> torch.Tensor:
        """uint8 [len(slots), bytes_per_token] on the device: the slots' rows, as `read`'s."""
        index = self._index(slots)
        rows = [self._rows(cache.index_select(1, index)) for pair in self.groups for cache in pair]
        return torch.cat(rows, dim=1)

    @torch.no_grad()
    def put_rows(self, slots: np.ndarray, rows: torch.Tensor) -> None:
        """Rows as `rows` gives them (uint8, on the device) into `slots`."""
        index = self._index(slots)
        start = 0
        for pair, half in zip(self.groups, self.halves, strict=True):
            for cache in pair:
                part = rows[:, start : start + half]
                start += half
                layers, _, heads, dim = cache.shape
                tokens = part.view(cache.dtype).unflatten(1, (layers, heads, dim))  # views only
                cache.index_copy_(1, index, tokens.transpose(0, 1))

    def _index(self, slots: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(self.device)

    @staticmethod
    def _rows(kv: torch.Tensor) -> torch.Tensor:
        """[layers, n, heads, dim] -> uint8 [n, bytes]: each token's layers side by side."""
        n = kv.shape[1]
        return kv.transpose(0, 1).contiguous().view(torch.uint8).view(n, -1)
