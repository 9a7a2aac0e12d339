"""MLXKVTransfer: the MLX runner's KV slots to host bytes and back (for the cache tiers).

The MLX cache is one `[slots + 1, kv_heads, head_dim]` array per layer for K and for V. A
token leaves as one row of bytes, as the torch runners' (`runner/kv_transfer.py`): per group
of layers of one shape (`KVLayout.groups`: one group unless the shapes are mixed, Gemma 4),
its K of every layer of the group then its V. bfloat16 travels as raw bytes (numpy has no such
type).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np


class MLXKVTransfer:
    def __init__(self, attn: Any, device: Any) -> None:
        self.attn, self.device = attn, device
        self.dtype = attn.k_cache[0].dtype
        itemsize = attn.k_cache[0].itemsize
        self.groups: list[tuple[int, int, tuple[int, ...]]] = list(attn.layout.groups)
        # bytes of one token's K (or V) in each group's layers
        self.halves = [len(layers) * h * d * itemsize for h, d, layers in self.groups]
        self.bytes_per_token = 2 * sum(self.halves)

    def read(self, slots: np.ndarray) -> np.ndarray:
        n = len(slots)
        index = mx.array(np.ascontiguousarray(slots, dtype=np.int32))
        with mx.stream(self.device):
            halves = [
                mx.stack([caches[layer][index] for layer in layers], axis=1)
                .view(mx.uint8)
                .reshape(n, -1)  # [n, layers * heads * dim * itemsize]
                for _, _, layers in self.groups
                for caches in (self.attn.k_cache, self.attn.v_cache)
            ]
            rows = mx.concatenate(halves, axis=1)
            mx.eval(rows)
        return np.array(rows)

    def write(self, prefix: np.ndarray, slots: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        rows = np.concatenate(parts) if len(parts) != 1 else parts[0]
        index = mx.array(np.ascontiguousarray(slots, dtype=np.int32))
        n, start = len(slots), 0
        with mx.stream(self.device):
            for (heads, dim, layers), half in zip(self.groups, self.halves, strict=True):
                for caches in (self.attn.k_cache, self.attn.v_cache):
                    part = np.ascontiguousarray(rows[:, start : start + half])
                    start += half
                    tokens = mx.array(part).view(self.dtype).reshape(n, len(layers), heads, dim)
                    for j, layer in enumerate(layers):
                        caches[layer][index] = tokens[:, j]
            mx.eval(self.attn.state())
