"""Ascend attention: torch_npu's fused inference attention for decode, torch-native otherwise.

Decode-only steps call `torch_npu.npu_fused_infer_attention_score` (its incremental branch,
taken when the query length is 1) with each request's KV length, so no padding mask is built:
- page size a multiple of 16 (the op's block-size rule): straight on the paged cache, viewed as
  `[num_blocks, block_size, Hkv * D]`, with a block table ("BSH" layout, no gather);
- otherwise on K/V gathered from the slot table ("BSND" layout).
Extends (prefill) and every other case run the torch-native reference on the same cache; if the
fused op is missing or rejects the call, the backend logs it once and stays torch-native.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from localradix.model_api.attention import AttentionBackend
from localradix.model_api.attention_spec import AttentionSpec
from localradix.model_api.kv_layout import KVLayout
from localradix.runner.attention_torch import TorchNativeAttention
from localradix.step import ForwardBatch

logger = logging.getLogger("localradix.runner")

BLOCK_MULTIPLE = 16  # fused paged attention takes blocks of a multiple of 16 tokens (fp16/bf16)


def block_table(batch: ForwardBatch, page_size: int) -> np.ndarray:
    """int32 [B, max pages]: each request's pages (slot // page_size), padded with page 0."""
    pages = (batch.seq_lens + page_size - 1) // page_size
    table = np.zeros((batch.num_reqs, int(pages.max())), dtype=np.int32)
    for i, (start, n) in enumerate(zip(batch.kv_indptr[:-1], pages)):
        table[i, :n] = batch.kv_indices[start : start + n * page_size : page_size] // page_size
    return table


def slot_table(batch: ForwardBatch) -> np.ndarray:
    """int64 [B, max len]: each request's slots, padded with the dummy slot 0."""
    width = int(batch.seq_lens.max())
    cols = np.arange(width)
    valid = cols[None, :] < batch.seq_lens[:, None]
    flat = np.minimum(batch.kv_indptr[:-1, None] + cols[None, :], len(batch.kv_indices) - 1)
    return np.where(valid, batch.kv_indices[flat], 0)


class NpuFusedAttention(AttentionBackend):
    takes_page_size = True

    def __init__(
        self,
        layout: KVLayout,
        device: torch.device | str,
        num_heads: int,
        spec: AttentionSpec | None = None,
    ) -> None:
        import torch_npu

        super().__init__(layout, device, spec)
        self.npu: Any = torch_npu  # (`self.ops` stays the model's LayerOps)
        self.num_heads, self.page_size = num_heads, layout.page_size
        self.paged = layout.page_size % BLOCK_MULTIPLE == 0
        whole_pages = layout.pages * layout.page_size  # the cache is whole blocks
        self.native = TorchNativeAttention(layout.with_slots(whole_pages - 1), device)
        self.fused = self.dtype in (torch.float16, torch.bfloat16)
        self._scale_kw = "scale"  # older torch_npu releases name it scale_value
        self._plan: dict[str, Any] | None = None

    def prepare(self, batch: ForwardBatch) -> None:
        self.native.prepare(batch)
        self._plan = None
        if self.fused and batch.is_decode_only and (self.paged or self._gather_fits(batch)):
            self._plan = self._plan_decode(batch)

    def _gather_fits(self, batch: ForwardBatch) -> bool:
        """Gathered K/V stay within the native backend's budget (it splits bigger batches)."""
        per_token = self.layout.layer_bytes_per_token
        width = int(batch.seq_lens.max())
        return batch.num_reqs * width * per_token <= self.native.decode_gather_bytes

    def _plan_decode(self, batch: ForwardBatch) -> dict[str, Any]:
        lens = [int(n) for n in batch.seq_lens]
        if self.paged:
            table = self._tensor(block_table(batch, self.page_size))
            return {"block_table": table, "actual_seq_lengths_kv": lens}
        return {"slots": self._tensor(slot_table(batch)), "actual_seq_lengths_kv": lens}

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> None:
        self.native.store_kv(k, v, layer_id)  # (the same cache and out_slots)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        scale: float,
        sinks: torch.Tensor | None = None,  # never given: applies_sinks is False
        stored: bool = False,
    ) -> torch.Tensor:
        if self._plan is None:
            return self.native.forward(q, k, v, layer_id, scale, stored=stored)
        if not stored:
            self.store_kv(k, v, layer_id)
        k_cache, v_cache = self.native.k_cache[layer_id], self.native.v_cache[layer_id]
        try:
            return self._fused_decode(q, k_cache, v_cache, scale)
        except (RuntimeError, TypeError, AttributeError) as exc:
            logger.warning("fused NPU attention unavailable (%s); using torch-native", exc)
            self.fused, self._plan = False, None
            return self.native.forward(q, k, v, layer_id, scale, stored=True)

    def _fused_decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        assert self._plan is not None
        batch, heads, dim = q.shape
        kw: dict[str, Any] = {
            "num_heads": heads,
            "num_key_value_heads": self.num_kv_heads,
            "actual_seq_lengths_kv": self._plan["actual_seq_lengths_kv"],
        }
        if self.paged:  # the cache in place: [num_blocks, block_size, Hkv * D]
            blocks = (-1, self.page_size, self.num_kv_heads * dim)
            args = (q.reshape(batch, 1, heads * dim), k_cache.view(blocks), v_cache.view(blocks))
            kw |= {"input_layout": "BSH", "block_table": self._plan["block_table"]}
            kw["block_size"] = self.page_size
        else:  # K/V gathered per request: [B, L, Hkv, D]
            slots = self._plan["slots"]
            args = (q.unsqueeze(1).contiguous(), k_cache[slots], v_cache[slots])
            kw["input_layout"] = "BSND"
        out = self._call(args, kw, scale)
        return out.reshape(batch, heads * dim)

    def _call(self, args: tuple[torch.Tensor, ...], kw: dict[str, Any], scale: float) -> Any:
        op = self.npu.npu_fused_infer_attention_score
        try:
            return op(*args, **kw, **{self._scale_kw: scale})[0]
        except TypeError:
            if self._scale_kw != "scale":
                raise
            self._scale_kw = "scale_value"
            return op(*args, **kw, scale_value=scale)[0]

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, non_blocking=True)
