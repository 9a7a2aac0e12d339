"""KVLayout: how one model's KV cache is laid out, the same for every backend.

Per layer, K and V are each `slots + 1` token slots of `[kv_heads, head_dim]` (slot 0 is the
padding dummy). Paged kernels (FlashInfer, Ascend) see the same memory as
`[pages, page_size, kv_heads, head_dim]`, because the pool numbers slots `page * page_size +
row`. The KV budget sizes the pool from it, attention backends allocate from it, `doctor`
prints it. No torch here.

Mixed shapes (Gemma 4, whose full-attention layers have bigger heads): `layer_shapes` gives
each KV layer's (kv_heads, head_dim), and `kv_heads` / `head_dim` are the first layer's. A
backend that can hold them (`AttentionBackend.applies_mixed_shapes`: torch-native, Triton)
keeps one `[layers_of_group, slots + 1, kv_heads, head_dim]` tensor per distinct shape
(`groups`) and indexes layer `i` as its group's tensor at the layer's place in it; the others
refuse such a model. Layers that share another's K/V (Gemma 4's last layers) are no KV layers
at all: the model hands the backend the id of the KV layer they read.
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
    layer_shapes: tuple[tuple[int, int], ...] = ()  # mixed: each layer's (kv_heads, head_dim)

    @classmethod
    def for_model(cls, config: Any, dtype: str, slots: int = 0, page_size: int = 1) -> KVLayout:
        """The layout of a `ModelConfig`'s cache (anything with the fields used)."""
        c = config
        layers = getattr(c, "kv_layers", None) or c.num_hidden_layers
        shapes = tuple((int(h), int(d)) for h, d in getattr(c, "kv_layer_shapes", ()) or ())
        if not shapes:
            return cls(layers, c.num_key_value_heads, c.head_dim, dtype, slots, page_size)
        mixed = shapes if len(set(shapes)) > 1 else ()
        return cls(len(shapes), *shapes[0], dtype, slots, page_size, mixed)

    def with_slots(self, slots: int) -> KVLayout:
        return dataclasses.replace(self, slots=slots)

    def with_page_size(self, page_size: int) -> KVLayout:
        return dataclasses.replace(self, page_size=page_size)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def uniform(self) -> bool:
        return not self.layer_shapes

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """Each layer's (kv_heads, head_dim)."""
        return self.layer_shapes or ((self.kv_heads, self.head_dim),) * self.layers

    @property
    def groups(self) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
        """(kv_heads, head_dim, its layers) of each distinct shape, in order of first use."""
        found: dict[tuple[int, int], list[int]] = {}
        for layer, shape in enumerate(self.shapes):
            found.setdefault(shape, []).append(layer)
        return tuple((h, d, tuple(layers)) for (h, d), layers in found.items())

    @property
    def layer_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies in one layer, the biggest (what a gather of it
        reads)."""
        return max((2 * h * d for h, d in self.shapes), default=0) * self.itemsize

    @property
    def bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies across all layers (what the pool reserves)."""
        return sum(2 * h * d for h, d in self.shapes) * self.itemsize

    def describe_layers(self) -> str:
        """E.g. "30 layers x 3 KV heads x 64 dims" (mixed: one such term per shape, "+")."""
        return " + ".join(
            f"{len(layers)} layers x {h} KV heads x {d} dims" for h, d, layers in self.groups
        )

    @property
    def slot_shape(self) -> tuple[int, int, int]:
        """One layer's K (or V): [slots + 1, kv_heads, head_dim] (mixed: the first layer's)."""
        return (self.slots + 1, self.kv_heads, self.head_dim)

    @property
    def pages(self) -> int:
        """Pages that hold every slot, the dummy included."""
        return -(-(self.slots + 1) // self.page_size)
