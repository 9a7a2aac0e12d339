"""MLXKVTransfer: the MLX runner's KV slots to host bytes and back (for the cache tiers).

The MLX cache is one `[slots + 1, kv_heads, head_dim]` array per layer for K and for V. A
token leaves as one row of bytes, its K of every layer then its V, as the torch runners'
(`runner/kv_transfer.py`); bfloat16 travels as raw bytes (numpy has no such type).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np


class MLXKVTransfer:
    def __init__(self, attn: Any, device: Any) -> None:
        self.attn, self.device = attn, device
        first = attn.k_cache[0]
        self.layers, self.heads, self.dim = len(attn.k_cache), first.shape[1], first.shape[2]
        self.dtype = first.dtype
        self.half = self.layers * self.heads * self.dim * first.itemsize
        self.bytes_per_token = 2 * self.half

    def read(self, slots: np.ndarray) -> np.ndarray:
        index = mx.array(np.ascontiguousarray(slots, dtype=np.int32))
        with mx.stream(self.device):
            halves = [
                mx.stack([layer[index] for layer in caches], axis=1).view(mx.uint8)
                for caches in (self.attn.k_cache, self.attn.v_cache)
            ]  # [n, layers, heads, dim * itemsize] each
            rows = mx.concatenate([h.reshape(len(slots), -1) for h in halves], axis=1)
            mx.eval(rows)
        return np.array(rows)

    def write(self, prefix: np.ndarray, slots: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        rows = np.concatenate(parts) if len(parts) != 1 else parts[0]
        index = mx.array(np.ascontiguousarray(slots, dtype=np.int32))
        n, shape = len(slots), (len(slots), self.layers, self.heads, -1)
        with mx.stream(self.device):
            for caches, half in ((self.attn.k_cache, rows[:, : self.half]),
                                 (self.attn.v_cache, rows[:, self.half :])):  # fmt: skip
                tokens = mx.array(np.ascontiguousarray(half)).reshape(shape).view(self.dtype)
                for layer in range(self.layers):
                    caches[layer][index] = tokens[:, layer].reshape(n, self.heads, self.dim)
            mx.eval(self.attn.state())
