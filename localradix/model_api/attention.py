"""Attention backends: the only code that touches the KV cache.

Model code calls `attn.forward(q, k, v, layer_id, scale)` (gpt-oss adds its layer's attention
`sinks`), or first `attn.rope_store(...)` (q/k norm, RoPE and the K/V store: one kernel where
the backend has one), then `forward(..., stored=True)`; it never sees slots or kernels. What
differs by layer (windows, soft-caps, sinks) the backend knows from the model's
`AttentionSpec`, given when it is made. The runner calls `prepare(batch)` once per step, which
turns the numpy plan of a `ForwardBatch` into device tensors; every layer then reuses them.
Backends are entries of the lazy registry `ATTENTION_BACKENDS` ("module:Class", imported only
when chosen): the torch-native reference is listed here, and each device backend registers its
own kernels when its package loads (`localradix.backends.cuda`: FlashInfer;
`localradix.backends.npu`: the fused Ascend ops), so optional kernel libraries load only where
they are used. This module itself imports no torch; the numpy plan the torch-native and MLX
backends share is `attention_plan`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from localradix.model_api.attention_spec import AttentionSpec
from localradix.model_api.kv_layout import KVLayout
from localradix.registry import Registry

if TYPE_CHECKING:
    import torch

    from localradix.step import ForwardBatch

ATTENTION_BACKENDS: Registry[type[AttentionBackend]] = Registry(
    "attention backend",
    {"torch_native": "localradix.runner.attention_torch:TorchNativeAttention"},
)


def get_attention_backend(name: str) -> type[AttentionBackend]:
    """The backend class registered as `name` (imported on first use); UnknownName (a
    ValueError) lists the registered ones."""
    return ATTENTION_BACKENDS.load(name)


class AttentionBackend(ABC):
    """Paged attention over a KV cache of `num_slots + 1` token slots per layer.

    Invariants: slot 0 is a dummy (padding writes and reads land there, never real data);
    `prepare` is called once per step before any `forward`; `forward` is called once per layer
    per step, in any layer order, with the new tokens of that step in `ForwardBatch` order;
    `rope_store`, when a model uses it, runs just before its layer's `forward(stored=True)`.
    """

    def __init__(
        self, layout: KVLayout, device: torch.device | str, spec: AttentionSpec | None = None
    ) -> None:
        import torch

        self.layout = layout
        self.num_layers, self.num_kv_heads = layout.layers, layout.kv_heads
        self.head_dim, self.num_slots = layout.head_dim, layout.slots
        self.dtype: torch.dtype = getattr(torch, layout.dtype)
        self.device = device
        self.spec = spec or AttentionSpec.plain(layout.layers)
        from localradix.model_api.layer_ops import TORCH_LAYER_OPS, LayerOps

        # The fused per-layer ops the model calls between its matmuls (a GPU backend's kernels)
        self.ops: LayerOps = TORCH_LAYER_OPS
        if len(self.spec.layers) != layout.layers:
            raise ValueError(f"need one layer spec per KV layer ({layout.layers})")
        unmet = [
            name for name, needed in self.spec.needs().items() if needed and not self.applies(name)
        ]
        if unmet:
            raise ValueError(f"{type(self).__name__} cannot apply {', '.join(unmet)}")

    # Paged backends (FlashInfer, Ascend) also take the query head count and the page size.
    takes_page_size = False
    # Whether the cache may hold another dtype than q/k/v (cast on write and read).
    kv_dtype_may_differ = False
    # Which of the spec's per-layer features (`AttentionSpec.needs`) `forward` applies.
    applies_windows = False
    applies_logit_caps = False
    applies_sinks = False  # (a model whose config has `attention_sinks` passes them per call)
    # Whether KV layers may differ in kv_heads / head_dim (`KVLayout.layer_shapes`: Gemma 4).
    applies_mixed_shapes = False

    @classmethod
    def applies(cls, feature: str) -> bool:
        """Whether this backend applies a feature `AttentionSpec.needs` names."""
        return {
            "sliding-window attention": cls.applies_windows,
            "attention logit soft-caps": cls.applies_logit_caps,
            "attention sinks": cls.applies_sinks,
        }[feature]

    @classmethod
    def from_model_config(
        cls,
        config: Any,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
        page_size: int = 1,
    ) -> AttentionBackend:
        """Size the cache for a `ModelConfig` (anything with the fields used) and hand the
        backend the model's per-layer `AttentionSpec`; refuse, naming what is missing, a model
        whose windows, soft-caps, sinks or mixed KV shapes this backend cannot apply."""
        layout = KVLayout.for_model(config, _dtype_name(dtype), num_slots, page_size)
        spec = AttentionSpec.for_model(config, layout.layers)
        model = getattr(config, "architecture", "the model")
        unmet = [name for name, needed in spec.needs().items() if needed and not cls.applies(name)]
        use = "use the torch_native or triton attention backend"
        if unmet:
            raise ValueError(f"{cls.__name__} cannot apply {model}'s {', '.join(unmet)}: {use}")
        if not layout.uniform and not cls.applies_mixed_shapes:
            raise ValueError(
                f"{cls.__name__} cannot hold {model}'s KV layers of different head sizes: {use}"
            )
        make: Any = cls  # subclasses add keywords to __init__
        if not cls.takes_page_size:  # slot-granular: any page size works unchanged
            return make(layout, device, spec=spec)
        return make(layout, device, num_heads=config.num_attention_heads, spec=spec)

    @staticmethod
    def kv_bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes of K and V one token occupies across all layers (for sizing the pool)."""
        return KVLayout(num_layers, num_kv_heads, head_dim, _dtype_name(dtype)).bytes_per_token

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Turn the step's numpy plan into device tensors / kernel metadata, once per step."""

    @abstractmethod
    def store_kv(self, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> None:
        """Write k, v [T, Hkv, D] of the step's new tokens into layer `layer_id`'s cache at the
        batch's `out_slots` (cast to the cache's dtype)."""

    def rope_store(
        self,
        qk: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        norm_weight: torch.Tensor | None,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Norm and rotate q and k, store k and v: the work before attention, one call.

        qk [T, Hq + Hkv, D] (q heads, then k heads) gets each head's RMSNorm times
        `norm_weight` [Hq + Hkv, D] (None: no q/k norm), then RoPE on each head's leading R
        dims with cos / signed sin [T, 1, R] (None: a layer without RoPE); the rotated k and v
        [T, Hkv, D] go to the cache as `store_kv` puts them. Returns (q [T, Hq, D], k) for
        `forward(q, k, v, layer_id, scale, stored=True)`. This reference runs `ops.qk_norm_rope`
        and `store_kv`; a backend may do all of it in one kernel (Triton).
        """
        qk = self.ops.qk_norm_rope(qk, norm_weight, cos, sin, eps)
        kv_heads = v.shape[1]
        q, k = qk[:, :-kv_heads], qk[:, -kv_heads:]
        self.store_kv(k, v, layer_id)
        return q, k

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        scale: float,
        sinks: torch.Tensor | None = None,
        stored: bool = False,
    ) -> torch.Tensor:
        """Store k/v at the batch's `out_slots` (unless `stored`: `rope_store` did), then
        attend causally; returns [T, Hq * D].

        q: [T, Hq, D]; k, v: [T, Hkv, D] for the T new tokens. A new token at position p sees
        its request's slots of positions <= p (prefix from the cache, plus the new tokens).

        sinks: [Hq] attention sinks (gpt-oss), one logit per query head that joins the
        softmax's denominator only (no value: it takes weight from the keys), or None. They
        are weights, so the model hands its layer's with each call (a fixed tensor, which a
        CUDA graph may capture), while the backend is built from the config alone: only
        backends with `applies_sinks` take a model that has them (`from_model_config`).
        """


def store_slots(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Write k, v [T, Hkv, D] at token `slots` of one layer's caches, cast to their dtype. The
    caches may be paged ([pages, page_size, Hkv, D]): slot s is row s of their flat view."""
    for cache, new in ((k_cache, k), (v_cache, v)):
        flat = cache if cache.dim() == new.dim() else cache.view(-1, *new.shape[1:])
        flat.index_copy_(0, slots, new.to(cache.dtype))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
