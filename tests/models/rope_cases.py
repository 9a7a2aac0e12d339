"""Cases for `AttentionBackend.rope_store` (q/k norm + RoPE + K/V store) and their float64 truth.

A case is one step of two requests (one with a cached prefix) over a paged slot layout, with q,
k and v as views of one fused qkv projection (as the decoder hands them over) and a cache
filled with noise first, so that every slot the step must not touch can be checked unchanged.
The truth normalises and rotates in float64 from the very tables (rounded to the activations'
dtype) the backend gets, rotating each pair (i, i + R/2) by its angle, written out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from localradix.model_api.attention import AttentionBackend
from localradix.step import ForwardBatch

EPS = 1e-6
NUM_PAGES = 24  # (page 0 holds the dummy slot: never handed out)


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int  # 0: a layer without RoPE


SHAPES = [
    Shape(4, 2, 16, 16),
    Shape(6, 1, 32, 16),  # partial RoPE, one KV head
    Shape(3, 3, 24, 24),  # no GQA, a head size that is not a power of two
    Shape(8, 2, 64, 32),
    Shape(2, 1, 16, 0),
]


@dataclass(frozen=True)
class Case:
    qk: torch.Tensor  # [T, Hq + Hkv, D] (a view of qkv)
    v: torch.Tensor  # [T, Hkv, D] (a view of qkv)
    cos: torch.Tensor | None  # [T, 1, R]
    sin: torch.Tensor | None  # [T, 1, R], signed: -sin on the first half
    norm_weight: torch.Tensor | None  # [Hq + Hkv, D]
    batch: ForwardBatch


def slot_batch(page_size: int, seed: int) -> ForwardBatch:
    """Request a: 7 cached + 5 new tokens; request b: 4 new; whole pages in shuffled order."""
    rng = np.random.default_rng(seed)
    pages = [int(p) for p in rng.permutation(np.arange(1, NUM_PAGES))]
    tables = []
    for length in (12, 4):
        slots = [pages[-1] * page_size]
        pages.pop()
        while len(slots) < length:
            if len(slots) % page_size == 0:
                slots.append(pages.pop() * page_size)
            else:
                slots.append(slots[-1] + 1)
        tables.append(np.array(slots, dtype=np.int64))
    ids = [np.zeros(5, dtype=np.int64), np.zeros(4, dtype=np.int64)]
    return ForwardBatch.build(ids, tables, [7, 0])


def make_case(shape: Shape, dtype: torch.dtype, norm: bool, page_size: int, seed: int = 0) -> Case:
    gen = torch.Generator().manual_seed(seed)
    batch = slot_batch(page_size, seed)
    tokens, d = batch.num_tokens, shape.head_dim
    qk_heads = shape.heads + shape.kv_heads
    qkv = (torch.randn(tokens, (qk_heads + shape.kv_heads) * d, generator=gen) * 2).to(dtype)
    qk = qkv[:, : qk_heads * d].view(tokens, qk_heads, d)
    v = qkv[:, qk_heads * d :].view(tokens, shape.kv_heads, d)
    weight = (torch.rand(qk_heads, d, generator=gen) + 0.5).to(dtype) if norm else None
    if shape.rotary_dim == 0:
        return Case(qk, v, None, None, weight, batch)
    half = shape.rotary_dim // 2
    positions = torch.from_numpy(batch.positions).double()
    angles = positions[:, None] * 10000.0 ** (-torch.arange(half).double() / half)
    angles = angles + torch.rand(tokens, half, generator=gen).double() * 6  # all quadrants
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(dtype)[:, None]
    sin = torch.cat([-angles.sin(), angles.sin()], -1).to(dtype)[:, None]
    return Case(qk, v, cos, sin, weight, batch)


def truth(case: Case, eps: float = EPS) -> torch.Tensor:
    """float64 [T, Hq + Hkv, D]: each head normed (x / rms * w), then its pairs rotated."""
    x = case.qk.double()
    if case.norm_weight is not None:
        rms = (x.square().mean(-1, keepdim=True) + eps).sqrt()
        x = x / rms * case.norm_weight.double()
    if case.cos is None or case.sin is None:
        return x
    rot = case.cos.shape[-1]
    half = rot // 2
    c, s = case.cos[..., :half].double(), case.sin[..., half:].double()
    assert torch.equal(case.sin[..., :half], -case.sin[..., half:])
    a, b = x[..., :half], x[..., half:rot]
    return torch.cat([a * c - b * s, b * c + a * s, x[..., rot:]], dim=-1)


def fill_noise(attn: AttentionBackend, layer_id: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Fill one layer's caches with noise; returns copies of them."""
    gen = torch.Generator().manual_seed(seed + 1)
    k_cache, v_cache = attn.k_cache[layer_id], attn.v_cache[layer_id]  # type: ignore[attr-defined]
    for cache in (k_cache, v_cache):
        cache.copy_(torch.randn(cache.shape, generator=gen).to(cache.dtype) * 100)
    return k_cache.clone(), v_cache.clone()


def check_store(
    attn: AttentionBackend,
    case: Case,
    layer_id: int,
    before: tuple[torch.Tensor, ...],
    tol: float,
) -> None:
    """rope_store's outputs and the layer's cache, slot by slot, against the truth."""
    want = truth(case)
    heads = case.qk.shape[1] - case.v.shape[1]
    q, k = attn.rope_store(case.qk, case.v, layer_id, case.cos, case.sin, case.norm_weight, EPS)
    assert q.shape == (case.qk.shape[0], heads, case.qk.shape[2]) and q.dtype == case.qk.dtype
    _close(q, want[:, :heads], tol)
    _close(k, want[:, heads:], tol)
    k_cache, v_cache = attn.k_cache[layer_id], attn.v_cache[layer_id]  # type: ignore[attr-defined]
    out_slots = case.batch.out_slots.tolist()
    for row, slot in enumerate(out_slots):
        _close(k_cache[slot], want[row, heads:], tol)
        assert torch.equal(v_cache[slot], case.v[row].to(v_cache.dtype)), f"V at slot {slot}"
    others = [s for s in range(k_cache.shape[0]) if s not in set(out_slots)]
    assert torch.equal(k_cache[others], before[0][others]), "K written outside out_slots"
    assert torch.equal(v_cache[others], before[1][others]), "V written outside out_slots"


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
