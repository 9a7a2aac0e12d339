"""Triton paged attention: the GPU kernels where FlashInfer is not installed (CUDA, and ROCm
through Triton's AMD backend; Triton ships with every GPU build of torch).

KV cache per layer: `[slots + 1, Hkv, D]`, slot 0 the dummy, the layout of the torch-native
backend (a page is `page_size` consecutive slots, so every page size reads alike). A step's
plan is the `ForwardBatch` slot table itself, copied to the device once in `prepare`: a
decode-only batch runs the split-KV decode kernels, any other batch the extend kernel for
every request (a decode inside a mixed batch is a one-token extend). The kernels are in
`triton_kernels.py`. Before attention, a layer's q/k norm, RoPE and K/V store run as one
kernel too (`rope_store`, `triton_rope.py`).

Decode batches run under CUDA graphs (`graph_state` / `prepare_graph`, used by
`localradix.backends.cuda.graphs`): each captured batch size reads fixed buffers that are
refilled before a replay, and a split count fixed at capture.

Per-layer sliding windows and logit soft-caps (the model's `AttentionSpec`) and attention
sinks (`sinks`, given with each layer's call) are applied in the kernels, for the model
families that have them. KV layers of mixed shapes (Gemma 4: `KVLayout.layer_shapes`) keep one
cache tensor per shape, `k_cache[layer]` a view into its own; kernels take heads and head size
from the layer's cache and its q.

On a CPU this backend runs only on request (`--attention triton`), through Triton's
interpreter: a way to test the kernels and the whole engine over them, not a fast path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from localradix.model_api.attention import AttentionBackend, store_slots
from localradix.model_api.attention_spec import AttentionSpec
from localradix.model_api.kv_layout import KVLayout
from localradix.runner.kv_transfer import allocate_kv, layer_caches
from localradix.step import ForwardBatch

MAX_SPLITS = 16  # decode splits of one request's keys (a power of two: the merge's block)
KEYS_PER_SPLIT = 256  # fewer keys than this per split cost more in the merge than they gain
BUSY_PROGRAMS = 1024  # (request, KV head) programs that keep a large GPU busy without splits
BLOCK_N = 32  # keys per block
BLOCK_M = 32  # extend queries per program


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def decode_splits(max_len: int, programs: int) -> int:
    """Splits of each request's keys: enough programs for the GPU, at least KEYS_PER_SPLIT
    keys each, at most MAX_SPLITS."""
    by_length = -(-max_len // KEYS_PER_SPLIT)
    by_occupancy = -(-BUSY_PROGRAMS // max(programs, 1))
    return max(1, min(MAX_SPLITS, by_length, by_occupancy))


@dataclass(frozen=True)
class TritonGraphState:
    """What one captured decode batch size reads: fixed buffers, refilled before each replay,
    and a split count fixed at capture (each request's split length follows its own keys)."""

    batch_size: int
    splits: int
    out_slots: torch.Tensor  # int64 [batch_size]
    kv_indptr: torch.Tensor  # int32 [batch_size + 1]
    kv_indices: torch.Tensor  # int32 [max slots of the batch]
    seq_lens: torch.Tensor  # int32 [batch_size]


def interpreter_active() -> bool:
    """Whether triton runs kernels in its CPU interpreter (decided when it was first
    imported: its own library functions are made for one mode then)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.zeros, InterpretedFunction)


def _require_interpreter() -> None:
    """On a CPU the kernels run in Triton's interpreter, which must be on when triton is first
    imported."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if not interpreter_active():
        raise RuntimeError(
            "Triton attention on a CPU runs in Triton's interpreter, but triton was imported "
            "before it could be turned on: set TRITON_INTERPRET=1 in the environment"
        )


class TritonAttention(AttentionBackend):
    applies_windows = True  # (`from_model_config` passes a model's windows in)
    applies_logit_caps = True
    applies_sinks = True
    applies_mixed_shapes = True  # (each layer's K/V heads and head size come with its cache)

    def __init__(
        self,
        layout: KVLayout,
        device: torch.device | str,
        spec: AttentionSpec | None = None,
    ) -> None:
        super().__init__(layout, device, spec)
        if torch.device(device).type == "cpu":
            _require_interpreter()
        from localradix.backends.cuda import triton_kernels, triton_rope
        from localradix.backends.cuda.triton_ops import TritonLayerOps

        self.kernels, self.rope = triton_kernels, triton_rope
        self.ops = TritonLayerOps()  # add + RMSNorm and SiLU · mul, one kernel each
        self.kv_groups = allocate_kv(layout, self.dtype, device)  # per shape: (k, v)
        self.k_cache, self.v_cache = layer_caches(layout, self.kv_groups)
        self.page_size = layout.page_size
        self.windows, self.logit_caps = self.spec.windows, self.spec.logit_caps
        self._batch: ForwardBatch | None = None

    def prepare(self, batch: ForwardBatch) -> None:
        self._batch = batch
        self._out_slots = self._tensor(batch.out_slots, torch.long)
        self._qo_indptr = self._tensor(batch.qo_indptr)
        self._kv_indptr = self._tensor(batch.kv_indptr)
        self._kv_indices = self._tensor(batch.kv_indices)
        self._seq_lens = self._tensor(batch.seq_lens)
        self._decode = batch.is_decode_only
        if self._decode:
            programs = batch.num_reqs * self.num_kv_heads
            self._splits = decode_splits(int(batch.seq_lens.max()), programs)

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> None:
        store_slots(self.k_cache[layer_id], self.v_cache[layer_id], self._out_slots, k, v)

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
        """The reference's work as one kernel (`triton_rope.py`): one program per token."""
        k_cache, v_cache = self.k_cache[layer_id], self.v_cache[layer_id]
        qk = self.rope.qk_norm_rope_store(
            qk, v, norm_weight, cos, sin, eps, self._out_slots, k_cache, v_cache
        )
        kv_heads = v.shape[1]
        return qk[:, :-kv_heads], qk[:, -kv_heads:]

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
        if not stored:
            self.store_kv(k, v, layer_id)
        k_cache, v_cache = self.k_cache[layer_id], self.v_cache[layer_id]
        if q.stride(-1) != 1:
            q = q.contiguous()
        out = q.new_empty(q.shape)
        window, cap = self.windows[layer_id], self.logit_caps[layer_id]
        if self._decode:
            self._decode_attention(q, k_cache, v_cache, out, scale, window, cap, sinks)
        else:
            self._extend_attention(q, k_cache, v_cache, out, scale, window, cap, sinks)
        return out.view(q.shape[0], -1)

    # -- CUDA graphs (decode only; see localradix.backends.cuda.graphs) --------------------

    def graph_state(self, batch_size: int, max_pages: int) -> TritonGraphState:
        """Fixed buffers for `batch_size` decode requests of <= max_pages pages in all."""

        def zeros(n: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=self.device)

        max_len = max_pages * self.page_size
        splits = decode_splits(max_len // batch_size, batch_size * self.num_kv_heads)
        return TritonGraphState(
            batch_size,
            splits,
            out_slots=zeros(batch_size, torch.long),
            kv_indptr=zeros(batch_size + 1),
            kv_indices=zeros(max_len),
            seq_lens=zeros(batch_size),
        )

    def prepare_graph(self, state: TritonGraphState, batch: ForwardBatch) -> None:
        """Copy a (padded) decode batch into `state`'s buffers; run before each replay."""
        if batch.num_reqs != state.batch_size or not batch.is_decode_only:
            raise ValueError(f"graph state holds {state.batch_size} decode requests")
        n = len(batch.kv_indices)
        state.out_slots.copy_(torch.from_numpy(batch.out_slots), non_blocking=True)
        state.kv_indptr.copy_(_int32(batch.kv_indptr), non_blocking=True)
        state.kv_indices[:n].copy_(_int32(batch.kv_indices), non_blocking=True)
        state.seq_lens.copy_(_int32(batch.seq_lens), non_blocking=True)
        self._batch, self._decode, self._splits = batch, True, state.splits
        self._out_slots, self._kv_indptr = state.out_slots, state.kv_indptr
        self._kv_indices, self._seq_lens = state.kv_indices, state.seq_lens

    def _decode_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
        scale: float,
        window: int,
        cap: float,
        sinks: torch.Tensor | None = None,
    ) -> None:
        reqs, heads, dim = q.shape
        kv_heads = k_cache.shape[1]
        group = heads // kv_heads
        mid_o = torch.empty((reqs, heads, MAX_SPLITS, dim), dtype=torch.float32, device=q.device)
        mid_lse = torch.empty((reqs, heads, MAX_SPLITS), dtype=torch.float32, device=q.device)
        block_d = max(16, _next_power_of_2(dim))
        self.kernels.decode_partial_kernel[(reqs, kv_heads, self._splits)](
            q, k_cache, v_cache, self._kv_indptr, self._kv_indices, self._seq_lens,
            mid_o, mid_lse, scale, self._splits,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1),
            GROUP=group, HEAD_DIM=dim, BLOCK_G=max(16, _next_power_of_2(group)),
            BLOCK_D=block_d, BLOCK_N=BLOCK_N, MAX_SPLITS=MAX_SPLITS,
            window=window, logit_cap=cap,
        )  # fmt: skip
        self.kernels.decode_merge_kernel[(reqs, heads)](
            mid_o, mid_lse, out, q if sinks is None else sinks, self._splits,
            out.stride(0), out.stride(1),
            HEAD_DIM=dim, BLOCK_D=block_d, MAX_SPLITS=MAX_SPLITS, HAS_SINKS=sinks is not None,
        )  # fmt: skip

    def _extend_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
        scale: float,
        window: int,
        cap: float,
        sinks: torch.Tensor | None = None,
    ) -> None:
        assert self._batch is not None
        _, heads, dim = q.shape
        blocks = -(-int(self._batch.extend_lens.max()) // BLOCK_M)
        self.kernels.extend_kernel[(self._batch.num_reqs, heads, blocks)](
            q, k_cache, v_cache, out, self._qo_indptr, self._kv_indptr, self._kv_indices,
            self._seq_lens, q if sinks is None else sinks, scale,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
            GROUP=heads // k_cache.shape[1], HEAD_DIM=dim, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
            BLOCK_D=max(16, _next_power_of_2(dim)), window=window, logit_cap=cap,
            HAS_SINKS=sinks is not None,
        )  # fmt: skip

    def _tensor(self, array: np.ndarray, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        host = torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
        return host.to(self.device, non_blocking=True)


def _int32(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int32))
