"""CPU stand-ins for the GPU-only pieces, with the semantics their documentation gives.

- `FakeFlashInfer`: a `flashinfer` module whose batch prefill / decode wrappers compute paged
  attention in plain torch from the CSR page table they were planned with (in graph mode: from
  their fixed buffers, as the real ones do), causal masks aligned to the end of each request.
- `FakeGraphApi`: "captures" a step by running it and "replays" by running it again into the same
  output tensor, checking that a replay runs exactly the wrappers the capture ran and that no
  plan happens during a replay.
- `FakeTorchNpu`: `torch_npu.npu_fused_infer_attention_score` for the two layouts we call it with.
- `PagedSlots`: page-aligned slot allocation from a shuffled free list of pages (page 0 = dummy).
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import torch

from localradix.step import ForwardBatch

PLAN_KWARGS = {"causal", "sm_scale", "q_data_type", "kv_data_type"}


def reference_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [pages, P, Hkv, D]
    v_cache: torch.Tensor,
    qo_indptr: np.ndarray,
    kv_indptr: np.ndarray,
    kv_indices: np.ndarray,
    last_page_len: np.ndarray,
    scale: float,
) -> torch.Tensor:
    page_size, heads = k_cache.shape[1], q.shape[1]
    out = torch.empty_like(q)
    for i in range(len(last_page_len)):
        pages = torch.as_tensor(kv_indices[kv_indptr[i] : kv_indptr[i + 1]], dtype=torch.long)
        length = (len(pages) - 1) * page_size + int(last_page_len[i])
        k = k_cache[pages].flatten(0, 1)[:length].float()
        v = v_cache[pages].flatten(0, 1)[:length].float()
        group = heads // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        qi = q[rows].float()
        scores = torch.einsum("ehd,lhd->hel", qi, k) * scale
        e = qi.shape[0]
        visible = torch.arange(length)[None, :] <= (length - e + torch.arange(e))[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[rows] = torch.einsum("hel,lhd->ehd", scores.softmax(-1), v).to(q.dtype)
    return out


class FakeFlashInfer:
    """Build with `.module()`; records planning and running for the tests to inspect."""

    def __init__(self) -> None:
        self.replaying = False
        self.recording: list[Any] | None = None  # wrappers run while capturing / replaying
        self.plans = {"prefill": 0, "decode": 0, "graph": 0}
        self.runs = {"prefill": 0, "decode": 0, "graph": 0}

    def module(self) -> types.ModuleType:
        fake = self
        mod = types.ModuleType("flashinfer")

        class Prefill(_Wrapper):
            kind = "prefill"

        class Decode(_Wrapper):
            kind = "decode"

        Prefill.fake = Decode.fake = fake  # type: ignore[attr-defined]
        mod.BatchPrefillWithPagedKVCacheWrapper = Prefill
        mod.BatchDecodeWithPagedKVCacheWrapper = Decode
        mod.__version__ = "0.0-fake"
        return mod


class _Wrapper:
    kind = ""
    fake: FakeFlashInfer

    def __init__(
        self,
        workspace: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
    ) -> None:
        assert kv_layout == "NHD" and workspace.dtype == torch.uint8
        self.graph = use_cuda_graph
        if use_cuda_graph:
            assert self.kind == "decode", "only decode wrappers are captured here"
            bufs = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
            assert all(isinstance(b, torch.Tensor) for b in bufs)
            assert len(bufs[0]) == len(bufs[2]) + 1
            self.buffers = bufs
        self.table: tuple[np.ndarray, ...] | None = None

    def plan(self, *args: Any, non_blocking: bool = False, **kwargs: Any) -> None:
        assert not self.fake.replaying, "plan() must run before a replay, not inside it"
        assert non_blocking, "a blocking plan() would wait for the device (no overlap)"
        assert set(kwargs) <= PLAN_KWARGS, f"unknown plan keywords {set(kwargs) - PLAN_KWARGS}"
        tensors = args[:4] if self.kind == "prefill" else args[:3]
        for t in tensors:
            assert t.dtype == torch.int32 and t.device.type == "cpu"
        arrays = [t.numpy().copy() for t in tensors]
        if self.kind == "decode":
            arrays.insert(0, np.arange(len(arrays[2]) + 1, dtype=np.int32))
        else:
            assert kwargs.get("causal") is True
        qo, indptr, indices, last = arrays
        heads, kv_heads, head_dim, page_size = args[len(tensors) : len(tensors) + 4]
        self.shape = (heads, kv_heads, head_dim, page_size)
        self.scale = kwargs["sm_scale"]
        key = "graph" if self.graph else self.kind
        self.fake.plans[key] += 1
        if self.graph:
            b_indptr, b_indices, b_last = self.buffers
            assert len(last) == len(b_last), "batch size is fixed in graph mode"
            b_indptr.copy_(torch.from_numpy(indptr))
            b_indices[: len(indices)].copy_(torch.from_numpy(indices))
            b_last.copy_(torch.from_numpy(last))
            self.qo = qo
        else:
            self.table = (qo, indptr, indices, last)

    def run(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        assert q.is_contiguous() and q.shape[1:] == (self.shape[0], self.shape[2])
        if self.fake.recording is not None:
            self.fake.recording.append(self)
        if self.graph:  # what a replay sees: the buffers, whatever the last plan wrote
            indptr = self.buffers[0].numpy()
            table = (
                self.qo,
                indptr,
                self.buffers[1].numpy()[: indptr[-1]],
                self.buffers[2].numpy(),
            )
        else:
            assert self.table is not None
            table = self.table
        self.fake.runs["graph" if self.graph else self.kind] += 1
        return reference_attention(q, kv[0], kv[1], *table, self.scale)


class FakeGraphApi:
    def __init__(self, fake: FakeFlashInfer) -> None:
        self.fake = fake
        self.captured: list[int] = []
        self.replays = 0

    def capture(self, fn: Any) -> tuple[Any, torch.Tensor]:
        self.fake.recording = []
        out = fn()
        ran = list(self.fake.recording)
        self.fake.recording = None
        self.captured.append(out.shape[0])
        assert ran and all(w.graph for w in ran), "a captured step must use graph wrappers"

        def replay() -> None:
            self.fake.replaying, self.fake.recording = True, []
            try:
                out.copy_(fn())
                assert self.fake.recording == ran, "replay ran other wrappers than the capture"
            finally:
                self.fake.replaying, self.fake.recording = False, None
            self.replays += 1

        return replay, out


class FakeTorchNpu:
    """`npu_fused_infer_attention_score`; `scale_name` is the keyword this release uses."""

    def __init__(self, scale_name: str = "scale", broken: bool = False) -> None:
        self.scale_name, self.broken = scale_name, broken
        self.calls: list[str] = []

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("torch_npu")
        mod.npu_fused_infer_attention_score = self.fused_infer_attention_score
        mod.__version__ = "0.0-fake"
        return mod

    def fused_infer_attention_score(self, query, key, value, **kw):  # noqa: ANN001, ANN003
        if self.broken:
            raise RuntimeError("aclnnFusedInferAttentionScore not supported on this SoC")
        if self.scale_name not in kw:
            raise TypeError(f"npu_fused_infer_attention_score() missing {self.scale_name}")
        scale = kw.pop(self.scale_name)
        heads, kv_heads = kw.pop("num_heads"), kw.pop("num_key_value_heads")
        lens, layout = kw.pop("actual_seq_lengths_kv"), kw.pop("input_layout")
        self.calls.append(layout)
        if layout == "BSH":
            table, block = kw.pop("block_table"), kw.pop("block_size")
            batch, dim = query.shape[0], query.shape[2] // heads
            q = query.view(batch, heads, dim)
            keys = [_paged(key, table[b], block, lens[b], kv_heads) for b in range(batch)]
            values = [_paged(value, table[b], block, lens[b], kv_heads) for b in range(batch)]
        else:
            assert layout == "BSND"
            batch, dim = query.shape[0], query.shape[3]
            q = query[:, 0]
            keys = [key[b, : lens[b]] for b in range(batch)]
            values = [value[b, : lens[b]] for b in range(batch)]
        if kw:
            raise TypeError(f"unexpected keywords {sorted(kw)}")
        out = torch.stack([_dense(q[b], keys[b], values[b], scale) for b in range(batch)])
        return out.reshape(query.shape), None


def _paged(cache: torch.Tensor, pages: torch.Tensor, block: int, n: int, kv_heads: int):
    used = pages[: -(-n // block)].long()
    return cache[used].reshape(-1, kv_heads, cache.shape[2] // kv_heads)[:n]


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    group = q.shape[0] // k.shape[1]
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scores = torch.einsum("hd,lhd->hl", q.float(), k) * scale
    return torch.einsum("hl,lhd->hd", scores.softmax(-1), v).to(q.dtype)


class PagedSlots:
    """Slot tables made of whole pages handed out in shuffled order (page 0 never)."""

    def __init__(self, num_pages: int, page_size: int, seed: int = 0) -> None:
        self.page_size = page_size
        order = np.random.default_rng(seed).permutation(np.arange(1, num_pages))
        self.free = [int(p) for p in order]
        self.tables: dict[str, list[int]] = {}

    def extend(self, name: str, n: int) -> np.ndarray:
        table = self.tables.setdefault(name, [])
        for _ in range(n):
            if len(table) % self.page_size == 0:
                page = self.free.pop()
                row = 0
            else:
                page, row = divmod(table[-1], self.page_size)
                row += 1
            table.append(page * self.page_size + row)
        return np.array(table, dtype=np.int64)

    def batch(self, new: dict[str, list[int]]) -> ForwardBatch:
        ids, tables, prefixes = [], [], []
        for name, tokens in new.items():
            prefixes.append(len(self.tables.get(name, [])))
            tables.append(self.extend(name, len(tokens)))
            ids.append(np.array(tokens, dtype=np.int64))
        return ForwardBatch.build(ids, tables, prefixes)
