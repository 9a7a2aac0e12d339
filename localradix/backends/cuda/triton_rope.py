"""q/k RMSNorm + RoPE + K/V store in one Triton kernel (the Triton backend's `rope_store`).

One program per token loads its q and k heads as one [heads, head_dim] tile, normalises each
head in float32 (times the per-head weight, when the model has q/k norm), rotates the leading
`rotary_dim` dims (rotate-half layout, its sign folded into the sin table: each dim reads its
partner half a rotation away, normed alike), and writes q and k to a fresh [T, Hq + Hkv, D]
output and k and v into the layer's cache at the token's slot, cast to the cache's dtype. The
math is the torch reference's (`LayerOps.qk_norm_rope`), rounded once instead of per op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _qk_norm_rope_store(
    qk_ptr, v_ptr, w_ptr, cos_ptr, sin_ptr, slots_ptr, out_ptr, k_cache_ptr, v_cache_ptr, eps,
    stride_qk_t, stride_qk_h, stride_v_t, stride_v_h, stride_cos, stride_sin,
    stride_out_t, stride_out_h, stride_kc_s, stride_kc_h, stride_vc_s, stride_vc_h,
    NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, HEAD_DIM: tl.constexpr, ROT: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < NUM_Q + NUM_KV) & (dims < HEAD_DIM)
    row = qk_ptr + t * stride_qk_t + heads * stride_qk_h
    x = tl.load(row + dims, mask=mask, other=0.0).to(tl.float32)
    half = ROT // 2
    partner = tl.where(dims < half, dims + half, dims - half)  # rotate-half's source dim
    partner = tl.where(dims < ROT, partner, dims)
    if HAS_ROPE:
        xp = tl.load(row + partner, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
        w = tl.load(w_ptr + heads * HEAD_DIM + dims, mask=mask, other=0.0).to(tl.float32)
        x = x * inv_rms * w
        if HAS_ROPE:
            wp = tl.load(w_ptr + heads * HEAD_DIM + partner, mask=mask, other=0.0)
            xp = xp * inv_rms * wp.to(tl.float32)
    if HAS_ROPE:
        rotated = dims < ROT
        cos = tl.load(cos_ptr + t * stride_cos + dims, mask=rotated, other=1.0).to(tl.float32)
        sin = tl.load(sin_ptr + t * stride_sin + dims, mask=rotated, other=0.0).to(tl.float32)
        x = x * cos + xp * sin
    tl.store(
        out_ptr + t * stride_out_t + heads * stride_out_h + dims,
        x.to(out_ptr.dtype.element_ty),
        mask=mask,
    )
    slot = tl.load(slots_ptr + t).to(tl.int64)
    k_heads = tl.maximum(heads - NUM_Q, 0)
    tl.store(
        k_cache_ptr + slot * stride_kc_s + k_heads * stride_kc_h + dims,
        x.to(k_cache_ptr.dtype.element_ty),
        mask=mask & (heads >= NUM_Q),
    )
    v_heads = tl.arange(0, BLOCK_KV)[:, None]
    v_mask = (v_heads < NUM_KV) & (dims < HEAD_DIM)
    v = tl.load(v_ptr + t * stride_v_t + v_heads * stride_v_h + dims, mask=v_mask, other=0.0)
    tl.store(
        v_cache_ptr + slot * stride_vc_s + v_heads * stride_vc_h + dims,
        v.to(v_cache_ptr.dtype.element_ty),
        mask=v_mask,
    )


def qk_norm_rope_store(
    qk: torch.Tensor,
    v: torch.Tensor,
    norm_weight: torch.Tensor | None,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    eps: float,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> torch.Tensor:
    """qk [T, Hq + Hkv, D], v [T, Hkv, D] (each head's dims contiguous), norm_weight [Hq +
    Hkv, D] or None, cos / signed sin [T, 1, R] or None, slots int [T], caches [slots, Hkv, D]
    -> the normed, rotated qk [T, Hq + Hkv, D]; k and v written at `slots`."""
    tokens, heads, dim = qk.shape
    kv_heads = v.shape[1]
    out = torch.empty((tokens, heads, dim), dtype=qk.dtype, device=qk.device)
    if tokens == 0:
        return out
    assert qk.stride(-1) == 1 and v.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    weight = qk if norm_weight is None else norm_weight.contiguous()
    has_rope = cos is not None and sin is not None
    rot = cos.shape[-1] if cos is not None else dim
    cos2 = qk if cos is None else cos.reshape(tokens, -1)
    sin2 = qk if sin is None else sin.reshape(tokens, -1)
    block_h, block_d = triton.next_power_of_2(heads), triton.next_power_of_2(dim)
    warps = max(4, min(16, block_h * block_d // 1024))  # ~1k elements of the tile per warp
    _qk_norm_rope_store[(tokens,)](
        qk, v, weight, cos2, sin2, slots, out, k_cache, v_cache, eps,
        qk.stride(0), qk.stride(1), v.stride(0), v.stride(1), cos2.stride(0), sin2.stride(0),
        out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        NUM_Q=heads - kv_heads, NUM_KV=kv_heads, HEAD_DIM=dim, ROT=rot,
        BLOCK_H=block_h, BLOCK_KV=triton.next_power_of_2(kv_heads), BLOCK_D=block_d,
        HAS_NORM=norm_weight is not None, HAS_ROPE=has_rope, num_warps=warps,
    )  # fmt: skip
    return out
