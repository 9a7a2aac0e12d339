"""Paged attention kernels in Triton, reading the KV cache through the step's slot table.

The cache of one layer is `[slots, Hkv, D]` (a page of `page_size` slots is `page_size`
consecutive rows, so any page size reads the same way); request i's keys are the slots
`kv_indices[kv_indptr[i]:kv_indptr[i] + seq_lens[i]]`, in sequence order, its new tokens the
last `extend_lens[i]` of them (already stored when a kernel runs).

- Decode (one new token a request), split-KV in two stages: stage 1 runs one program per
  (request, KV head, split) over a contiguous part of the request's keys, for all the query
  heads sharing that KV head at once (one `tl.dot` per block: GQA reads each key once);
  stage 2 merges the splits by their log-sum-exp. Splits keep a GPU busy when the batch is
  small and the context long.
- Extend (prefill over a cached prefix, chunks, speculative verifies): one program per
  (request, query head, block of new tokens) over the request's keys up to the block's last
  position, causally masked.

Both honour a sliding window (a query at position p sees keys p - window < j <= p; 0: none),
a logit soft-cap (`cap * tanh(s / cap)`; 0: none) and attention sinks (`HAS_SINKS`: a logit
per query head added to the softmax's denominator only, as gpt-oss's; decode adds it when
merging the splits), for the model families that need them.
Softmax runs in base 2 (`exp2`, scores pre-multiplied by log2 e), with a guard for rows whose
keys are all masked in a block (a window's first blocks). Written for this project from the
published split-KV ("flash decoding") and FlashAttention-2 designs.

On a CPU, Triton's interpreter runs these (`TRITON_INTERPRET=1` before triton is imported):
the tests check them there against a float64 reference.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _scores(q, keys, scale, logit_cap: tl.constexpr):
    """Scores in base 2 of q [M, D] against keys [N, D], soft-capped when asked."""
    s = tl.dot(q, tl.trans(keys), input_precision="ieee") * scale
    if logit_cap > 0:
        s = logit_cap * (2.0 * tl.sigmoid(2.0 * s / logit_cap) - 1.0)  # cap * tanh(s / cap)
    return s * 1.4426950408889634


@triton.jit
def _kv_block(
    k_ptr, v_ptr, indices_ptr, j, valid, kv_head, d,
    stride_ks, stride_kh, stride_vs, stride_vh, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """Keys and values [N, D] of one KV head at a request's key positions j (masked: 0)."""
    slot = tl.load(indices_ptr + j, mask=valid, other=0).to(tl.int64)
    mask = valid[:, None] & (d[None, :] < HEAD_DIM)
    keys = tl.load(k_ptr + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
                   mask=mask, other=0.0)  # fmt: skip
    values = tl.load(v_ptr + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
                     mask=mask, other=0.0)  # fmt: skip
    return keys, values


@triton.jit
def _online_softmax_step(s, m_i, l_i, acc, values):
    """Fold one block of scores s [M, N] (masked entries -inf) and its values [N, D] into the
    running max m_i, sum l_i and output acc."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet stays 0
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def decode_partial_kernel(
    q_ptr,  # [B, Hq, D]
    k_ptr,  # [slots, Hkv, D]
    v_ptr,
    kv_indptr_ptr,  # [B + 1]
    kv_indices_ptr,
    seq_lens_ptr,  # [B]
    mid_o_ptr,  # float32 [B, Hq, MAX_SPLITS, D]: each split's normalised output
    mid_lse_ptr,  # float32 [B, Hq, MAX_SPLITS]: its log-sum-exp (base 2)
    scale,
    num_splits,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,  # GROUP rounded up (>= 16 for tl.dot)
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    window: tl.constexpr,
    logit_cap: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    kv_start = tl.load(kv_indptr_ptr + req)
    per_split = tl.cdiv(seq_len, num_splits)
    lo = split * per_split
    hi = tl.minimum(seq_len, lo + per_split)
    if window > 0:
        lo = tl.maximum(lo, seq_len - window)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g
    q_mask = (g[:, None] < GROUP) & (d[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr + req * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0
    )

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        valid = j < hi
        keys, values = _kv_block(
            k_ptr, v_ptr, kv_indices_ptr + kv_start, j, valid, kv_head, d,
            stride_ks, stride_kh, stride_vs, stride_vh, HEAD_DIM,
        )  # fmt: skip
        s = _scores(q, keys, scale, logit_cap)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, m_i, l_i, acc, values)

    empty = l_i == 0.0  # a split past the window, or past a short request's keys
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    row = (req * tl.num_programs(1) * GROUP + heads) * MAX_SPLITS + split
    tl.store(mid_o_ptr + row[:, None] * HEAD_DIM + d[None, :], out, mask=q_mask)
    tl.store(mid_lse_ptr + row, lse, mask=g < GROUP)


@triton.jit
def decode_merge_kernel(
    mid_o_ptr,  # float32 [B, Hq, MAX_SPLITS, D]
    mid_lse_ptr,  # float32 [B, Hq, MAX_SPLITS]
    out_ptr,  # [B, Hq, D]
    sinks_ptr,  # [Hq] attention sinks (read only when HAS_SINKS)
    num_splits,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    row = req * tl.num_programs(1) + head
    sp = tl.arange(0, MAX_SPLITS)
    d = tl.arange(0, BLOCK_D)
    lse = tl.load(mid_lse_ptr + row * MAX_SPLITS + sp, mask=sp < num_splits, other=float("-inf"))
    if HAS_SINKS:  # one more term of the denominator, in base 2 like the splits' lse
        sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        top = tl.maximum(tl.max(lse, 0), sink)
        weight = tl.exp2(lse - top)
        denominator = tl.sum(weight, 0) + tl.exp2(sink - top)
    else:
        weight = tl.exp2(lse - tl.max(lse, 0))  # the last key is in some split: max is finite
        denominator = tl.sum(weight, 0)
    parts = tl.load(
        mid_o_ptr + (row * MAX_SPLITS + sp[:, None]) * HEAD_DIM + d[None, :],
        mask=(sp[:, None] < num_splits) & (d[None, :] < HEAD_DIM),
        other=0.0,
    )
    out = tl.sum(parts * weight[:, None], 0) / denominator
    tl.store(
        out_ptr + req * stride_ob + head * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d < HEAD_DIM,
    )


@triton.jit
def extend_kernel(
    q_ptr,  # [T, Hq, D]: every request's new tokens
    k_ptr,  # [slots, Hkv, D]
    v_ptr,
    out_ptr,  # [T, Hq, D]
    qo_indptr_ptr,  # [B + 1]
    kv_indptr_ptr,
    kv_indices_ptr,
    seq_lens_ptr,
    sinks_ptr,  # [Hq] attention sinks (read only when HAS_SINKS)
    scale,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    window: tl.constexpr,
    logit_cap: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    block = tl.program_id(2)
    q_start = tl.load(qo_indptr_ptr + req)
    extend_len = tl.load(qo_indptr_ptr + req + 1) - q_start
    if block * BLOCK_M >= extend_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    kv_start = tl.load(kv_indptr_ptr + req)
    prefix_len = seq_len - extend_len
    kv_head = head // GROUP

    i = block * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    rows = i < extend_len
    # Rows past the request's new tokens take its first new position: masked like a real
    # query (never an all-masked row) and never stored.
    q_pos = prefix_len + tl.where(rows, i, 0)
    q_mask = rows[:, None] & (d[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr + (q_start + i)[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=q_mask,
        other=0.0,
    )

    hi = tl.minimum(seq_len, prefix_len + (block + 1) * BLOCK_M)  # causal: up to the last row
    lo = 0
    if window > 0:
        lo = tl.maximum(0, prefix_len + block * BLOCK_M - window + 1)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        valid = j < hi
        keys, values = _kv_block(
            k_ptr, v_ptr, kv_indices_ptr + kv_start, j, valid, kv_head, d,
            stride_ks, stride_kh, stride_vs, stride_vh, HEAD_DIM,
        )  # fmt: skip
        s = _scores(q, keys, scale, logit_cap)
        seen = valid[None, :] & (j[None, :] <= q_pos[:, None])
        if window > 0:
            seen = seen & (j[None, :] > q_pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, m_i, l_i, acc, values)

    if HAS_SINKS:  # the sink's share of the denominator (relative to the running max m_i)
        sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        l_i = l_i + tl.exp2(sink - m_i)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr + (q_start + i)[:, None] * stride_ot + head * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )
