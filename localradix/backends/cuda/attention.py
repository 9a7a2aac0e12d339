"""FlashInfer paged attention (NVIDIA CUDA; AMD Instinct through the FlashInfer+ROCm port).

KV layout: per layer, K and V caches of `[num_pages, page_size, Hkv, D]` (FlashInfer's "NHD"),
the same memory as `[num_pages * page_size, Hkv, D]` token slots, because the pool numbers
slots `page * page_size + row`. So the new tokens' K/V are written with one `index_copy_` at the
batch's `out_slots` for any page size, and `paged_kv` turns each request's slot list into
FlashInfer's CSR page table once per step.

A decode-only batch runs the decode wrapper; a batch with any extend runs the prefill wrapper for
every request (FlashInfer aligns the causal mask to the end of each request's KV, so a decode
inside a mixed batch is a length-1 extend). Decode batches can also run under CUDA graphs: one
decode wrapper per graph batch size, planned into fixed buffers before each replay
(`graph_state` / `prepare_graph`, used by `localradix.backends.cuda.graphs`).

`flashinfer` is imported when the backend is built, never when this module is imported.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from localradix.model_api.attention import AttentionBackend, store_slots
from localradix.model_api.attention_spec import AttentionSpec
from localradix.model_api.kv_layout import KVLayout
from localradix.runner.torch_runner import device_event
from localradix.step import ForwardBatch

NHD = "NHD"


@dataclass(frozen=True)
class PagedKV:
    """FlashInfer's page table for one step (int32, host memory)."""

    qo_indptr: np.ndarray  # [B + 1]: offsets of each request's new tokens
    kv_indptr: np.ndarray  # [B + 1]: offsets into kv_indices, in pages
    kv_indices: np.ndarray  # [sum of pages]: each request's page ids, in sequence order
    last_page_len: np.ndarray  # [B]: tokens in each request's last page, 1..page_size


def paged_kv(batch: ForwardBatch, page_size: int, check: bool = True) -> PagedKV:
    """The batch's token-slot tables as page tables: page of slot s is s // page_size.

    With `check`, raises ValueError unless every request's slots fill its pages in order
    (slot j of a request sits at row j % page_size of its page), which the pool guarantees.
    """
    seq = batch.seq_lens
    pages = (seq + page_size - 1) // page_size
    kv_indptr = np.zeros(len(seq) + 1, dtype=np.int64)
    np.cumsum(pages, out=kv_indptr[1:])
    if page_size == 1:
        indices = batch.kv_indices
    else:
        offset = np.arange(len(batch.kv_indices)) - np.repeat(batch.kv_indptr[:-1], seq)
        row = offset % page_size
        if check:
            _check_pages(batch.kv_indices - row, row == 0, page_size)
        indices = batch.kv_indices[row == 0] // page_size
    return PagedKV(
        qo_indptr=batch.qo_indptr.astype(np.int32),
        kv_indptr=kv_indptr.astype(np.int32),
        kv_indices=indices.astype(np.int32),
        last_page_len=(seq - (pages - 1) * page_size).astype(np.int32),
    )


def _check_pages(base: np.ndarray, first: np.ndarray, page_size: int) -> None:
    """base = slot - row must be the page's first slot, the same for all rows of a page."""
    page_of = np.cumsum(first) - 1
    if (base % page_size).any() or (base != base[first][page_of]).any():
        raise ValueError(f"slot tables do not fill whole pages of {page_size} slots in order")


@dataclass(frozen=True)
class DecodeGraphState:
    """What one captured decode batch size reads: a graph-mode wrapper and fixed slot buffer."""

    batch_size: int
    wrapper: Any  # flashinfer.BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True)
    out_slots: torch.Tensor  # int64 [batch_size]: where the step's K/V go, rewritten per replay


class FlashInferAttention(AttentionBackend):
    """Paged attention through FlashInfer's batch prefill / decode wrappers (fp16 / bf16)."""

    takes_page_size = True
    workspace_bytes = 128 * 2**20  # FlashInfer's float workspace, shared by all wrappers

    def __init__(
        self,
        layout: KVLayout,
        device: torch.device | str,
        num_heads: int,
        spec: AttentionSpec | None = None,
    ) -> None:
        import flashinfer

        super().__init__(layout, device, spec)
        dtype = self.dtype
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"FlashInfer attention needs float16 or bfloat16, not {dtype}")
        self.fi = flashinfer
        self.num_heads, self.page_size = num_heads, layout.page_size
        self.sm_scale = layout.head_dim**-0.5
        self.num_pages = layout.pages  # slot ids are <= num_slots
        shape = (layout.layers, self.num_pages, layout.page_size, layout.kv_heads, layout.head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.workspace = torch.zeros(self.workspace_bytes, dtype=torch.uint8, device=device)
        # Tensor-core decode pays off once several query heads share a KV head.
        self.tensor_cores = num_heads // layout.kv_heads >= 4
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, NHD)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, NHD, use_tensor_cores=self.tensor_cores
        )
        self._prefill_kw = self._plan_kwargs(self._prefill)
        self._decode_kw = self._plan_kwargs(self._decode)
        self._graph_indices: torch.Tensor | None = None  # shared by every graph wrapper
        self._active: Any = None
        self._out_slots = torch.zeros(0, dtype=torch.long, device=device)
        self._plan_copied: dict[int, Any] = {}  # wrapper id -> event after its last plan

    # -- per step ------------------------------------------------------------------------

    def prepare(self, batch: ForwardBatch) -> None:
        kv = paged_kv(batch, self.page_size)
        self._out_slots = _to(batch.out_slots, self.device)
        heads = (self.num_heads, self.num_kv_heads, self.head_dim, self.page_size)
        table = (_host(kv.kv_indptr), _host(kv.kv_indices), _host(kv.last_page_len))
        if batch.is_decode_only:
            self._plan(self._decode, *table, *heads, **self._decode_kw)
            self._active = self._decode
        else:
            qo = _host(kv.qo_indptr)
            self._plan(self._prefill, qo, *table, *heads, causal=True, **self._prefill_kw)
            self._active = self._prefill

    def _plan(self, wrapper: Any, *args: Any, **kwargs: Any) -> None:
        """`wrapper.plan`, once the wrapper's previous plan has reached the device.

        FlashInfer plans into one pinned host buffer per wrapper and copies it to the device
        asynchronously. With overlap scheduling step N+1 is planned before step N has run, so
        planning at once could rewrite the buffer before step N's copy reads it. The wait is
        short: step N's copy runs as soon as step N-1 ends, and the host has read step N-1.
        """
        copied = self._plan_copied.get(id(wrapper))
        if copied is not None:
            copied.synchronize()
        wrapper.plan(*args, **kwargs)
        self._plan_copied[id(wrapper)] = device_event(self.device)

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> None:
        store_slots(self.k_cache[layer_id], self.v_cache[layer_id], self._out_slots, k, v)

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
        if abs(scale - self.sm_scale) > 1e-6 * self.sm_scale:
            raise ValueError(f"planned for softmax scale {self.sm_scale}, got {scale}")
        if not stored:
            self.store_kv(k, v, layer_id)
        k_cache, v_cache = self.k_cache[layer_id], self.v_cache[layer_id]
        out = self._active.run(q.contiguous(), (k_cache, v_cache))  # [T, Hq, D]
        return out.reshape(q.shape[0], -1)

    def _plan_kwargs(self, wrapper: Any) -> dict[str, Any]:
        kw = {"sm_scale": self.sm_scale, "q_data_type": self.dtype, "kv_data_type": self.dtype}
        # A blocking host-to-device copy waits for the whole stream, which would stall the
        # overlap scheduler; releases whose plan() takes non_blocking get it explicitly.
        try:
            if "non_blocking" in inspect.signature(wrapper.plan).parameters:
                kw["non_blocking"] = True
        except (TypeError, ValueError):
            pass
        return kw

    # -- CUDA graphs (decode only) -------------------------------------------------------

    def graph_state(self, batch_size: int, max_pages: int) -> DecodeGraphState:
        """A decode wrapper with fixed buffers for `batch_size` requests of <= max_pages pages."""
        if self._graph_indices is None or len(self._graph_indices) < max_pages:
            self._graph_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        wrapper = self.fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            NHD,
            use_cuda_graph=True,
            use_tensor_cores=self.tensor_cores,
            paged_kv_indptr_buffer=torch.zeros(
                batch_size + 1, dtype=torch.int32, device=self.device
            ),
            paged_kv_indices_buffer=self._graph_indices,
            paged_kv_last_page_len_buffer=torch.ones(
                batch_size, dtype=torch.int32, device=self.device
            ),
        )
        out_slots = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        return DecodeGraphState(batch_size, wrapper, out_slots)

    def prepare_graph(self, state: DecodeGraphState, batch: ForwardBatch) -> None:
        """Plan a (padded) decode batch into `state`'s fixed buffers; run before each replay."""
        if batch.num_reqs != state.batch_size or not batch.is_decode_only:
            raise ValueError(f"graph state holds {state.batch_size} decode requests")
        kv = paged_kv(batch, self.page_size)
        table = (_host(kv.kv_indptr), _host(kv.kv_indices), _host(kv.last_page_len))
        heads = (self.num_heads, self.num_kv_heads, self.head_dim, self.page_size)
        self._plan(state.wrapper, *table, *heads, **self._decode_kw)
        state.out_slots.copy_(torch.from_numpy(batch.out_slots), non_blocking=True)
        self._active, self._out_slots = state.wrapper, state.out_slots


def _host(array: np.ndarray) -> torch.Tensor:
    """int32 host tensor: FlashInfer plans on the host and copies what kernels need itself."""
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int32))


def _to(array: np.ndarray, device: torch.device | str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)
