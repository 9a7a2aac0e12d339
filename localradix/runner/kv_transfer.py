"""TorchKVTransfer: a torch runner's KV slots to host bytes and back (for the cache tiers).

Every torch attention backend keeps K and V as `[layers, slots + 1, kv_heads, head_dim]` (the
paged ones as `[layers, pages, page_size, ...]`, the same memory). A token's KV leaves as one
row of bytes: its K for every layer, then its V, so the tiers below the radix tree store and
slice KV token by token without knowing the dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class TorchKVTransfer:
    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        layers, heads, dim = k_cache.shape[0], k_cache.shape[-2], k_cache.shape[-1]
        self.k = k_cache.view(layers, -1, heads, dim)  # slot-major whatever the paging
        self.v = v_cache.view(layers, -1, heads, dim)
        self.half = layers * heads * dim * k_cache.element_size()
        self.bytes_per_token = 2 * self.half

    @torch.no_grad()
    def read(self, slots: np.ndarray) -> np.ndarray:
        index = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(self.k.device)
        k, v = (self._rows(cache.index_select(1, index)) for cache in (self.k, self.v))
        return torch.cat([k, v], dim=1).cpu().numpy()

    def write(self, prefix: np.ndarray, slots: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        done = 0
        for part in parts:  # chunk by chunk: no copy of a whole prompt's KV
            self._write(slots[done : done + len(part)], part)
            done += len(part)

    @torch.no_grad()
    def _write(self, slots: np.ndarray, data: np.ndarray) -> None:
        device = self.k.device
        index = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(device)
        rows = torch.from_numpy(np.ascontiguousarray(data, dtype=np.uint8)).to(device)
        for cache, part in ((self.k, rows[:, : self.half]), (self.v, rows[:, self.half :])):
            layers, _, heads, dim = cache.shape
            tokens = part.view(cache.dtype).unflatten(1, (layers, heads, dim))  # views only
            cache.index_copy_(1, index, tokens.transpose(0, 1))

    @staticmethod
    def _rows(kv: torch.Tensor) -> torch.Tensor:
        """[layers, n, heads, dim] -> uint8 [n, bytes]: each token's layers side by side."""
        n = kv.shape[1]
        return kv.transpose(0, 1).contiguous().view(torch.uint8).view(n, -1)
