"""KVLayout: how one model's KV cache is laid out, the same for every backend.

Per layer, K and V are each `slots + 1` token slots of `[kv_heads, head_dim]` (slot 0 is the
padding dummy). Paged kernels (FlashInfer, Ascend) see the same memory as
`[pages, page_size, kv_heads, head_dim]`, because the pool numbers slots `page * page_size +
row`. The KV budget sizes the pool from it, attention backends allocate from it, `doctor`
prints it. No torch here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class KVLayout:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str  # "float32", "bfloat16" or "float16"
    slots: int = 0  # token slots, not counting the dummy slot 0 (0: not sized yet)
    page_size: int = 1

    @classmethod
    def for_model(cls, config: Any, dtype: str, slots: int = 0, page_size: int = 1) -> KVLayout:
        """The layout of a `ModelConfig`'s cache (anything with the fields used)."""
        c = config
        layers = getattr(c, "kv_layers", None) or c.num_hidden_layers
        return cls(layers, c.num_key_value_heads, c.head_dim, dtype, slots, page_size)

    def with_slots(self, slots: int) -> KVLayout:
        return dataclasses.replace(self, slots=slots)

    def with_page_size(self, page_size: int) -> KVLayout:
        return dataclasses.replace(self, page_size=page_size)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def layer_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies in one layer (what a gather of it reads)."""
        return 2 * self.kv_heads * self.head_dim * self.itemsize

    @property
    def bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies across all layers (what the pool reserves)."""
        return self.layers * self.layer_bytes_per_token

    @property
    def slot_shape(self) -> tuple[int, int, int]:
        """One layer's K (or V): [slots + 1, kv_heads, head_dim]."""
        return (self.slots + 1, self.kv_heads, self.head_dim)

    @property
    def pages(self) -> int:
        """Pages that hold every slot, the dummy included."""
        return -(-(self.slots + 1) // self.page_size)
