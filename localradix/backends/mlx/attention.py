"""Paged attention over MLX KV arrays, the MLX twin of `runner/attention_torch.py`.

Each layer keeps K and V as MLX arrays [num_slots + 1, Hkv, D] indexed by the shared pool's
slots (slot 0 is the padding dummy), so radix matches, eviction and retraction work exactly as
on torch. Per layer: the new tokens' K/V are scattered to `out_slots`; all decode requests run
as one batched SDPA over K/V gathered into a padded [B, L] slot table; each extend request runs
its own SDPA with a causal mask shifted by its cached prefix (plain "causal" without a prefix).
Decode requests on a shared cached prefix attend to it once per group (cascade), as on torch.

Layers with a sliding window (`AttentionSpec.windows`, per layer; 0 = none: a query at position p sees keys
p - window < j <= p: Gemma 3, gpt-oss) attend by their own plan of the step, whose slot tables
keep only the keys inside the window (extends: a banded mask). Every slot stays cached, windowed
layers only read less, so a radix-cache hit of any length is exact. Attention sinks (gpt-oss)
go to SDPA as they are; the cascade merges them like one more key without a value.

KV layers may differ in shape (`KVLayout.layer_shapes`, Gemma 4's bigger full-attention heads):
each layer's arrays have its own [num_slots + 1, Hkv, D]. A layer that reads another's K/V
(Gemma 4's KV-shared layers) calls `forward` under that layer's id with `store=False`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from localradix.model_api.attention_spec import AttentionSpec
from localradix.model_api.kv_layout import KVLayout
from localradix.runner import attention_plan as plans
from localradix.step import ForwardBatch


@dataclass(frozen=True)
class _DecodePlan:
    rows: np.ndarray  # [B] rows of q that are decode tokens
    row_index: mx.array | None  # the same as an MLX array; None = every row of q
    slots: mx.array | slice  # [B, L] padded slot table, or a slice for one contiguous request
    mask: mx.array | None  # bool [B, 1, 1, L]: True = attend; None = no padding
    # (rows of the plan, the prefix's slots) per group sharing a cached prefix; `slots`/`mask`
    # then cover each request's slots after its group's prefix.
    shared: tuple[tuple[mx.array, mx.array | slice], ...] = ()


@dataclass(frozen=True)
class _ExtendPlan:
    start: int  # first row of this request's new tokens in q
    end: int
    slots: mx.array | None  # [S] slots of prefix + new tokens; None = no prefix (use k/v)
    mask: mx.array | None  # bool [E, S] causal mask offset by the prefix


@dataclass(frozen=True)
class _StepPlan:
    decode: _DecodePlan | None
    extends: list[_ExtendPlan]
    order: mx.array | None  # rows of the concatenated pieces, in token order; None = in order


def _ints(array: np.ndarray) -> mx.array:
    return mx.array(np.ascontiguousarray(array, dtype=np.int32))


class MLXPagedAttention:
    """Same protocol as `model_api.attention.AttentionBackend`: prepare(batch), then forward per layer."""

    def __init__(
        self, layout: KVLayout, dtype: mx.Dtype, spec: AttentionSpec | None = None
    ) -> None:
        self.layout = layout
        self.num_slots = layout.slots
        shapes = [(layout.slots + 1, heads, dim) for heads, dim in layout.shapes]
        self.k_cache = [mx.zeros(shape, dtype=dtype) for shape in shapes]
        self.v_cache = [mx.zeros(shape, dtype=dtype) for shape in shapes]
        mx.eval(self.k_cache, self.v_cache)
        spec = spec or AttentionSpec.plain(layout.layers)
        if len(spec.layers) != layout.layers or spec.needs()["attention logit soft-caps"]:
            raise ValueError("MLX attention takes one layer spec per KV layer, without soft-caps")
        self.windows = spec.windows  # (sinks come with each call; soft-caps are not applied)
        self._out_slots = _ints(np.zeros(0))
        self._plans: dict[int, _StepPlan] = {}  # window -> the step's plan for its layers

    def state(self) -> list[mx.array]:
        """The cache arrays, for `mx.eval` at the end of a step (keeps the graph one step deep)."""
        return self.k_cache + self.v_cache

    def prepare(self, batch: ForwardBatch) -> None:
        self._out_slots = _ints(batch.out_slots)
        longest = int(batch.seq_lens.max()) if batch.num_reqs else 0
        self._plans = {}
        for window in sorted(set(self.windows)):
            key = 0 if window >= longest else window  # a window that hides no key this step
            if key not in self._plans:
                self._plans[key] = _step_plan(batch, key)
            self._plans[window] = self._plans[key]

    def forward(
        self,
        q: mx.array,
        k: mx.array,
        v: mx.array,
        layer_id: int,
        scale: float,
        sinks: mx.array | None = None,
        store: bool = True,
    ) -> mx.array:
        """q [T, Hq, D], k/v [T, Hkv, D] of the new tokens -> [T, Hq * D]. `sinks`: [Hq] logits
        in q's dtype that join each head's softmax denominator (gpt-oss). `store=False`: k/v
        are layer `layer_id`'s, already stored this step (a KV-shared layer reads them)."""
        if store:
            self.k_cache[layer_id][self._out_slots] = k
            self.v_cache[layer_id][self._out_slots] = v
        k_cache, v_cache = self.k_cache[layer_id], self.v_cache[layer_id]
        step = self._plans[self.windows[layer_id]]
        pieces = []
        if step.decode is not None:
            index = step.decode.row_index
            q_decode = q if index is None else q[index]
            pieces.append(_attend_decode(step.decode, q_decode, k_cache, v_cache, scale, sinks))
        for plan in step.extends:
            pieces.append(_attend_extend(plan, q, k, v, k_cache, v_cache, scale, sinks))
        out = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces, axis=0)
        return out if step.order is None else out[step.order]


# -- per-group attention -----------------------------------------------------------------


def _attend_decode(plan: _DecodePlan, q, k_cache, v_cache, scale: float, sinks):
    batch = q.shape[0]
    if plan.shared:
        return _cascade(plan, q, k_cache, v_cache, scale, sinks)
    if isinstance(plan.slots, slice):  # one request on contiguous slots
        keys, values = k_cache[plan.slots][None], v_cache[plan.slots][None]
    else:
        keys, values = k_cache[plan.slots], v_cache[plan.slots]  # [B, L, Hkv, D]
    out = mx.fast.scaled_dot_product_attention(
        q[:, :, None, :],  # [B, Hq, 1, D]
        keys.transpose(0, 2, 1, 3),
        values.transpose(0, 2, 1, 3),
        scale=scale,
        mask=plan.mask,
        sinks=sinks,
    )
    return out.reshape(batch, -1)


def _attend_extend(plan: _ExtendPlan, q, k, v, k_cache, v_cache, scale: float, sinks):
    rows = slice(plan.start, plan.end)
    mask: mx.array | str | None
    if plan.slots is None:
        keys, values, mask = k[rows], v[rows], "causal"  # no prefix: new tokens are all
    else:  # a cached prefix (causal mask shifted by it), or a window's band
        keys, values, mask = k_cache[plan.slots], v_cache[plan.slots], plan.mask
    out = mx.fast.scaled_dot_product_attention(
        q[rows].transpose(1, 0, 2)[None],  # [1, Hq, E, D]
        keys.transpose(1, 0, 2)[None],
        values.transpose(1, 0, 2)[None],
        scale=scale,
        mask=mask,
        sinks=sinks,
    )
    return out[0].transpose(1, 0, 2).reshape(plan.end - plan.start, -1)


# -- planning (numpy -> MLX index arrays, once per step) ----------------------------------


def _step_plan(batch: ForwardBatch, window: int) -> _StepPlan:
    plan = plans.plan_attention(batch, window=window)  # one decode group: MLX gathers lazily
    decode = _decode_plan(plan.decodes[0]) if plan.decodes else None
    extends = [_extend_plan(extend) for extend in plan.extends]
    # pieces come out as [decode rows..., extend 0, extend 1, ...]
    parts = [] if decode is None else [decode.rows]
    parts += [np.arange(p.start, p.end) for p in extends]
    produced = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    in_order = np.array_equal(produced, np.arange(batch.num_tokens))
    return _StepPlan(
        decode, extends, None if in_order else _ints(np.argsort(produced, kind="stable"))
    )


def _decode_plan(group: plans.DecodeGroup) -> _DecodePlan:
    row_index = None if group.all_rows else _ints(group.token_rows)
    if group.run is not None:
        return _DecodePlan(group.token_rows, row_index, group.run, None)
    mask = None if group.valid is None else mx.array(group.valid[:, None, None, :])
    shared = tuple(
        (_ints(p.rows), p.run if p.run is not None else _ints(p.slots)) for p in group.shared
    )
    return _DecodePlan(group.token_rows, row_index, _ints(group.slots), mask, shared)


def _extend_plan(plan: plans.ExtendPlan) -> _ExtendPlan:
    if plan.slots is None or plan.causal is None:
        return _ExtendPlan(plan.start, plan.end, None, None)
    return _ExtendPlan(plan.start, plan.end, _ints(plan.slots), mx.array(plan.causal))


def _partial(
    q: mx.array, keys: mx.array, values: mx.array, scale: float, mask: mx.array | None = None
) -> tuple[mx.array, mx.array, mx.array]:
    """Unnormalized attention of q [..., G, D] over keys/values [..., L, D]: (max, sum, out)."""
    scores = ((q * scale) @ keys.swapaxes(-1, -2)).astype(mx.float32)  # [..., G, L]
    if mask is not None:
        scores = mx.where(mask, scores, -mx.inf)
    top = scores.max(axis=-1, keepdims=True)
    weights = mx.exp(scores - top)
    out = (weights.astype(values.dtype) @ values).astype(mx.float32)
    return top, weights.sum(axis=-1, keepdims=True), out


def _cascade(
    plan: _DecodePlan,
    q: mx.array,
    k_cache: mx.array,
    v_cache: mx.array,
    scale: float,
    sinks: mx.array | None,
) -> mx.array:
    """Decode attention with shared prefixes: q [B, Hq, D] -> [B, Hq * D] (as on torch)."""
    batch, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    grouped = q.reshape(batch, kv_heads, num_heads // kv_heads, head_dim)  # [B, Hkv, G, D]
    keys = k_cache[plan.slots].transpose(0, 2, 1, 3)  # [B, Hkv, W, D]: each request's own part
    values = v_cache[plan.slots].transpose(0, 2, 1, 3)
    top, total, out = _partial(grouped, keys, values, scale, plan.mask)
    for rows, slots in plan.shared:
        size = rows.shape[0]
        stacked = grouped[rows].transpose(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)
        parts = _partial(
            stacked, k_cache[slots].transpose(1, 0, 2), v_cache[slots].transpose(1, 0, 2), scale
        )
        s_top, s_total, s_out = (
            t.reshape(kv_heads, size, -1, t.shape[-1]).transpose(1, 0, 2, 3) for t in parts
        )
        new_top = mx.maximum(top[rows], s_top)
        own, other = mx.exp(top[rows] - new_top), mx.exp(s_top - new_top)
        total[rows] = total[rows] * own + s_total * other
        out[rows] = out[rows] * own + s_out * other
        top[rows] = new_top
    if sinks is not None:  # one more logit per head, in the denominator only
        sink = sinks.astype(mx.float32).reshape(1, kv_heads, -1, 1)
        new_top = mx.maximum(top, sink)
        own = mx.exp(top - new_top)
        total, out = total * own + mx.exp(sink - new_top), out * own
    return (out / total).astype(q.dtype).reshape(batch, -1)
