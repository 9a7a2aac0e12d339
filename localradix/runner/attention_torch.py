"""The torch-native reference attention backend (any torch device, no extra libraries).

Per layer: K/V of the new tokens go to the cache with one `index_copy_`; all decode requests
(one new token each) run as ONE batched SDPA over K/V gathered into a [B, L] slot table, or,
when their lengths differ (a key-padding mask), as grouped matmuls (split into a few calls only
when the gathered K/V would pass `decode_gather_bytes`); each extend (prefill) request runs as
its own SDPA with a causal mask shifted by its cached prefix (`is_causal` when it has none).

Decode requests that share a cached prefix (the same radix-tree slots, e.g. one system prompt)
attend to it once per group ("cascade" attention, as FlashInfer's cascade kernels do): one
matmul of all their queries against the shared K/V, one over each request's own suffix, merged
by their log-sum-exp. The shared K/V is read once instead of once per request, which is what
decode at long shared contexts spends its time on.

Layers with a sliding window (`AttentionSpec.windows`, per layer; 0 = none: a query at position p sees keys
p - window < j <= p) run on their own plan of the step, whose slot tables keep only the keys
inside the window (extends: a banded mask). The cache keeps every slot; only reads are cut.
Mixed KV shapes (Gemma 4): `k_cache`/`v_cache` are lists of per-layer views (kv_transfer.py).
Layers without one run the plain plan and its fast paths.

Attention sinks (gpt-oss: a logit per query head in the softmax's denominator, no value) have
no SDPA form, so layers given `sinks` compute their scores explicitly: the grouped matmuls (an
extra softmax column; long extends in chunks of queries, to bound the scores' memory), or, for
decode batches, the cascade's partials, merged with the sink as one more (max = sink, sum = 1,
output 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from localradix.model_api.attention import AttentionBackend, store_slots
from localradix.model_api.attention_spec import AttentionSpec
from localradix.model_api.kv_layout import KVLayout
from localradix.runner import attention_plan as plans
from localradix.runner.kv_transfer import allocate_kv, layer_caches
from localradix.step import ForwardBatch

# Read at each step, so a benchmark can move it (benchmarks/bench_attention.py).
MIN_SHARED_PREFIX = plans.MIN_SHARED_PREFIX
# SDPA with both a mask and GQA runs PyTorch's slow math kernel on GPUs: there, decodes of
# different lengths take the grouped matmuls and masked extends repeat K/V per query head.
# On CPUs SDPA is the faster of the two by 1.2-8x (1 thread, 9/3 heads of 64: decode 8 x
# 512-2048 keys 0.35 vs 3.0 ms, extend 64 over 512 1.1 vs 2.1 ms). None: by device; tests
# set True to run the GPU path here.
GROUPED_WHEN_MASKED: bool | None = None
# Extends of at most this many tokens over a cached prefix (a verify step's k + 1, a short
# turn) attend with grouped matmuls, not SDPA: see `_grouped`.
SMALL_EXTEND = 16
# Most bytes of float32 scores one call of an extend with attention sinks materialises.
SINK_SCORE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class _SharedPrefix:
    rows: torch.Tensor  # [b] rows of the decode plan (b >= 2) whose slot tables start with it
    slots: torch.Tensor | slice  # [L] its slots (a slice when contiguous: a view, no copy)


@dataclass(frozen=True)
class _DecodePlan:
    token_index: torch.Tensor | None  # [B] rows of q that are decode tokens; None = all rows
    slots: torch.Tensor | slice  # [B, L] padded slot table, or a slice when B=1 and contiguous
    mask: torch.Tensor | None  # bool [B, 1, 1, L]: True = attend; None = no padding
    # With shared prefixes, `slots`/`mask` cover each request's slots after its group's prefix.
    shared: tuple[_SharedPrefix, ...] = ()


@dataclass(frozen=True)
class _ExtendPlan:
    start: int  # first row of this request's new tokens in q
    end: int
    # [S] slots of prefix + new tokens (a slice when contiguous); None = no prefix (use k/v)
    slots: torch.Tensor | slice | None
    mask: torch.Tensor | None  # bool [E, S] causal mask offset by the prefix; None = is_causal
    windowed: bool = False  # the mask is banded by a sliding window, not only causal


class TorchNativeAttention(AttentionBackend):
    # Most gathered decode K+V bytes per SDPA call; bigger decode batches are split.
    decode_gather_bytes = 64 * 2**20
    # The cache may be narrower than the model (bf16 K/V for an fp32 model): cast on write/read.
    kv_dtype_may_differ = True
    applies_windows = True
    applies_sinks = True
    applies_mixed_shapes = True

    def __init__(
        self, layout: KVLayout, device: torch.device | str, spec: AttentionSpec | None = None
    ) -> None:
        super().__init__(layout, device, spec)
        self.kv_groups = allocate_kv(layout, self.dtype, device)  # per shape: (k, v)
        self.k_cache, self.v_cache = layer_caches(layout, self.kv_groups)
        self.windows = self.spec.windows
        self._num_tokens = 0
        self._out_slots = torch.zeros(0, dtype=torch.long)
        # window -> (decode groups, extends) of the step, for every window of a layer
        self._plans: dict[int, tuple[list[_DecodePlan], list[_ExtendPlan]]] = {
            w: ([], []) for w in self.windows
        }

    def prepare(self, batch: ForwardBatch) -> None:
        self._num_tokens = batch.num_tokens
        self._out_slots = self._tensor(batch.out_slots)
        gather = self.decode_gather_bytes // self.layout.layer_bytes_per_token
        longest = int(batch.seq_lens.max()) if batch.num_reqs else 0
        self._plans = {}
        for window in sorted(set(self.windows)):
            key = 0 if window >= longest else window  # a window that hides no key this step
            if key not in self._plans:
                plan = plans.plan_attention(batch, gather, MIN_SHARED_PREFIX, key)
                decodes = [self._decode_plan(group) for group in plan.decodes]
                self._plans[key] = (decodes, [self._extend_plan(e) for e in plan.extends])
            self._plans[window] = self._plans[key]

    @property
    def _decodes(self) -> list[_DecodePlan]:
        """The step's decode groups for layers without a window."""
        return self._plans.get(0, ([], []))[0]

    @property
    def _extends(self) -> list[_ExtendPlan]:
        return self._plans.get(0, ([], []))[1]

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> None:
        store_slots(self.k_cache[layer_id], self.v_cache[layer_id], self._out_slots, k, v)

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
        decodes, extends = self._plans[self.windows[layer_id]]
        num_tokens, num_heads, head_dim = q.shape
        sinks = None if sinks is None else sinks.float()
        if len(decodes) == 1 and decodes[0].token_index is None:
            return self._attend_decode(decodes[0], q, k_cache, v_cache, scale, sinks)
        if len(extends) == 1 and not decodes:
            return self._attend_extend(extends[0], q, k, v, k_cache, v_cache, scale, sinks)
        out = q.new_empty(num_tokens, num_heads * head_dim)
        for group in decodes:
            rows = group.token_index
            out[rows] = self._attend_decode(group, q[rows], k_cache, v_cache, scale, sinks)
        for plan in extends:
            out[plan.start : plan.end] = self._attend_extend(
                plan, q, k, v, k_cache, v_cache, scale, sinks
            )
        return out

    # -- per-group attention -------------------------------------------------------------

    def _attend_decode(
        self,
        plan: _DecodePlan,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch = q.shape[0]
        if plan.shared or (plan.mask is not None and _avoid_masked_gqa_sdpa(q)):
            return _cascade(plan, q, k_cache, v_cache, scale, sinks).reshape(batch, -1)
        if isinstance(plan.slots, slice):  # one request on contiguous slots: a view, no copy
            return _grouped(q, k_cache[plan.slots], v_cache[plan.slots], scale, sinks=sinks)
        keys, values = k_cache[plan.slots], v_cache[plan.slots]  # [B, L, Hkv, D]
        if batch == 1:  # one request on scattered slots (after drafts)
            return _grouped(q, keys[0], values[0], scale, sinks=sinks)
        if sinks is not None:  # SDPA has no sink term
            return _cascade(plan, q, k_cache, v_cache, scale, sinks).reshape(batch, -1)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),  # [B, Hq, 1, D]
            keys.to(q.dtype).transpose(1, 2),
            values.to(q.dtype).transpose(1, 2),
            attn_mask=plan.mask,
            scale=scale,
            enable_gqa=True,
        )
        return out.reshape(batch, -1)

    def _attend_extend(
        self,
        plan: _ExtendPlan,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        rows = slice(plan.start, plan.end)
        if sinks is not None:
            k_all = k[rows] if plan.slots is None else k_cache[plan.slots]
            v_all = v[rows] if plan.slots is None else v_cache[plan.slots]
            band = plan.mask if plan.windowed else None
            return _with_sinks(q[rows], k_all, v_all, scale, sinks, band)
        if plan.slots is not None and plan.end - plan.start <= SMALL_EXTEND:
            keys, values = k_cache[plan.slots], v_cache[plan.slots]
            band = plan.mask if plan.windowed else None
            return _grouped(q[rows], keys, values, scale, causal=band is None, mask=band)
        if plan.slots is None:
            keys, values = k[rows], v[rows]  # no prefix: the new tokens are the whole sequence
        else:
            keys = k_cache[plan.slots].to(q.dtype)  # [S, Hkv, D]
            values = v_cache[plan.slots].to(q.dtype)
        group = q.shape[1] // keys.shape[1]
        if plan.mask is not None and group > 1 and _avoid_masked_gqa_sdpa(q):
            keys = keys.repeat_interleave(group, dim=1)
            values = values.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1).unsqueeze(0),  # [1, Hq, E, D]
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=plan.mask,
            is_causal=plan.mask is None,
            scale=scale,
            enable_gqa=keys.shape[1] != q.shape[1],
        )
        return out[0].transpose(0, 1).reshape(plan.end - plan.start, -1)

    # -- planning (numpy -> device tensors, once per step) -------------------------------

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, non_blocking=True)

    def _decode_plan(self, group: plans.DecodeGroup) -> _DecodePlan:
        token_index = None if group.all_rows else self._tensor(group.token_rows)
        if group.run is not None:
            return _DecodePlan(token_index, group.run, None)
        mask = None if group.valid is None else self._tensor(group.valid[:, None, None, :])
        shared = tuple(
            _SharedPrefix(
                self._tensor(p.rows), p.run if p.run is not None else self._tensor(p.slots)
            )
            for p in group.shared
        )
        return _DecodePlan(token_index, self._tensor(group.slots), mask, shared)

    def _extend_plan(self, plan: plans.ExtendPlan) -> _ExtendPlan:
        if plan.slots is None or plan.causal is None:
            return _ExtendPlan(plan.start, plan.end, None, None)
        slots = plan.run if plan.run is not None else self._tensor(plan.slots)
        mask = self._tensor(plan.causal)
        return _ExtendPlan(plan.start, plan.end, slots, mask, plan.windowed)


Partial = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (max, sum, unnormalized out)


def _avoid_masked_gqa_sdpa(q: torch.Tensor) -> bool:
    if GROUPED_WHEN_MASKED is not None:
        return GROUPED_WHEN_MASKED
    return q.device.type != "cpu"


def _grouped(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one request's T queries q [T, Hq, D] over its keys/values [S, Hkv, D]
    -> [T, Hq * D]; `causal`: the queries are the last T keys' tokens (a prefix before them);
    `mask`: bool [T, S], True = attend (a sliding window's band), instead; `sinks`: float32
    [Hq] logits that join each head's softmax denominator (an extra column, then dropped).

    The G query heads of each KV head and all T queries go through one matmul per KV head.
    On CPUs, SDPA with `enable_gqa` repeats K/V per query head first; at 4.4k context this
    takes a decode's attention from 1.3 to 0.6 ms per layer and a 9-row verify's from 2.2 to
    1.4 ms (SmolLM2-135M shapes, fp32, one thread).
    """
    tokens, num_heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    group = num_heads // kv_heads
    stacked = q.reshape(tokens, kv_heads, group, head_dim).permute(1, 2, 0, 3)
    stacked = stacked.reshape(kv_heads, group * tokens, head_dim)  # row g * T + t
    keys = keys.to(q.dtype).transpose(0, 1)  # [Hkv, S, D]
    values = values.to(q.dtype).transpose(0, 1)
    scores = torch.matmul(stacked * scale, keys.transpose(-1, -2)).float()  # [Hkv, G*T, S]
    if causal:  # only the last T keys need a mask: every query sees the whole prefix
        future = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).triu_(1)
        scores[:, :, -tokens:].masked_fill_(future.repeat(group, 1), float("-inf"))
    if mask is not None:
        scores.masked_fill_(~mask.repeat(group, 1), float("-inf"))
    if sinks is None:
        weights = torch.softmax(scores, dim=-1).to(values.dtype)
    else:
        column = sinks.view(kv_heads, group, 1).expand(-1, -1, tokens)
        scores = torch.cat([scores, column.reshape(kv_heads, group * tokens, 1)], dim=-1)
        weights = torch.softmax(scores, dim=-1)[..., :-1].to(values.dtype)
    out = torch.matmul(weights, values)  # [Hkv, G*T, D]
    return out.reshape(kv_heads, group, tokens, head_dim).permute(2, 0, 1, 3).reshape(tokens, -1)


def _with_sinks(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    sinks: torch.Tensor,
    band: torch.Tensor | None,
) -> torch.Tensor:
    """`_grouped` with sinks for one extend (causal over the last T keys, or a window's `band`
    [T, S]), in chunks of queries whose scores stay within SINK_SCORE_BYTES."""
    tokens, num_heads, _ = q.shape
    length = keys.shape[0]
    rows = max(1, SINK_SCORE_BYTES // (4 * num_heads * length))
    parts = []
    for start in range(0, tokens, rows):
        end = min(tokens, start + rows)
        if band is not None:
            part = _grouped(q[start:end], keys, values, scale, mask=band[start:end], sinks=sinks)
        else:  # these queries are the last of the keys up to the chunk's end
            seen = length - tokens + end
            part = _grouped(
                q[start:end], keys[:seen], values[:seen], scale, causal=True, sinks=sinks
            )
        parts.append(part)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _partial(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
) -> Partial:
    """Unnormalized attention of q [..., G, D] over keys/values [..., L, D]: (max, sum, out).

    out is exp(scores - max) @ values, so two partials over disjoint keys merge exactly.
    """
    # In-place where possible: on CPUs a fresh exp() output costs several times the math.
    scores = torch.matmul(q * scale, keys.transpose(-1, -2)).float()  # [..., G, L]
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    weights = scores.sub_(top).exp_()
    return top, weights.sum(dim=-1, keepdim=True), torch.matmul(weights.to(values.dtype), values)


def _cascade(
    plan: _DecodePlan,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention with shared prefixes (and float32 `sinks` [Hq], or None):
    q [B, Hq, D] -> [B, Hq, D]."""
    batch, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    grouped = q.reshape(batch, kv_heads, num_heads // kv_heads, head_dim)  # [B, Hkv, G, D]
    assert not isinstance(plan.slots, slice)
    keys = k_cache[plan.slots].to(q.dtype).permute(0, 2, 1, 3)  # [B, Hkv, W, D]: own part
    values = v_cache[plan.slots].to(q.dtype).permute(0, 2, 1, 3)
    top, total, out = _partial(grouped, keys, values, scale, plan.mask)  # mask [B, 1, 1, W]
    out = out.float()
    for group in plan.shared:
        rows = group.rows
        members = grouped[rows]  # [b, Hkv, G, D] -> all b*G queries of a KV head in one matmul
        stacked = members.permute(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)
        shared_k = k_cache[group.slots].to(q.dtype).transpose(0, 1)  # [Hkv, L, D]
        shared_v = v_cache[group.slots].to(q.dtype).transpose(0, 1)
        parts = _partial(stacked, shared_k, shared_v, scale)  # [Hkv, b*G, .] -> [b, Hkv, G, .]
        s_top, s_total, s_out = (
            t.float().reshape(kv_heads, len(rows), -1, t.shape[-1]).permute(1, 0, 2, 3)
            for t in parts
        )
        top[rows], total[rows], out[rows] = _merge(
            (top[rows], total[rows], out[rows]), (s_top, s_total, s_out)
        )
    if sinks is not None:  # a partial of one key: its logit, weight exp(0) = 1, no value
        sink = sinks.view(1, kv_heads, -1, 1)
        top, total, out = _merge((top, total, out), (sink, torch.ones_like(sink), sink * 0))
    return (out / total).to(q.dtype).reshape(batch, num_heads, head_dim)


def _merge(a: Partial, b: Partial) -> Partial:
    """Two partials of the same queries over disjoint keys, as one."""
    top = torch.maximum(a[0], b[0])
    wa, wb = torch.exp(a[0] - top), torch.exp(b[0] - top)
    return top, a[1] * wa + b[1] * wb, a[2] * wa + b[2] * wb
