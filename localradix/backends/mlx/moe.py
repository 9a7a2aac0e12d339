"""The mixture-of-experts MLP of Mixtral and Qwen3-MoE on MLX (twin of models/moe.py).

The router is a linear over the experts; softmax over all of them in float32, the top-k kept
and (Mixtral always, Qwen3-MoE with `norm_topk_prob`) renormalised to sum to 1, as transformers
does; Qwen3-MoE then rounds the weights to the activation dtype, Mixtral keeps them in float32.
Each expert is a SwiGLU MLP. Its weights are stacked at load into gate_up [E, 2I, H] (gate rows,
then up rows) and down [E, H, I], float or MLX-quantized (`--quantize` quantizes each expert's
matrices, which stack as one quantized array).

Each token's k experts run through `mx.gather_mm` / `mx.gather_qmm`, which gather the expert
matrices by index on the device: no host round trip, no data-dependent loop, and only the
chosen experts' FLOPs. From SORT_FROM (token, expert) pairs on, the pairs are sorted by expert
first, so each expert's matrix is read once for all its tokens (prefill).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from localradix.backends.mlx.quant import Dense, Linear, Quantized, QuantSpec, fuse
from localradix.backends.mlx.reader import WeightReader
from localradix.models.config import ModelConfig

SORT_FROM = 64


@dataclass(frozen=True)
class StackedExperts:
    """One matrix per expert, [E, out, in], float or quantized (one spec for all)."""

    weight: mx.array  # [E, out, in] float, or packed uint32 [E, out, in * bits / 32]
    scales: mx.array | None = None  # quantized: [E, out, in / group]
    biases: mx.array | None = None  # affine quantization's
    spec: QuantSpec | None = None  # None = float

    @staticmethod
    def dense(weight: mx.array) -> StackedExperts:
        """Float [E, out, in]. MLX's CPU `gather_mm` multiplies float32 only: there, half
        precision experts are kept as float32 (the activations are cast for the product)."""
        if weight.dtype != mx.float32 and mx.default_device() == mx.cpu:
            weight = weight.astype(mx.float32)
        return StackedExperts(weight)

    @staticmethod
    def stack(parts: Sequence[Linear], name: str) -> StackedExperts:
        """Per-expert matrices (float, or quantized alike) as one stacked weight."""
        if all(isinstance(p, Dense) for p in parts):
            return StackedExperts.dense(mx.stack([p.weight for p in parts if isinstance(p, Dense)]))
        quantized = [p for p in parts if isinstance(p, Quantized)]
        if len(quantized) < len(parts) or len({p.spec for p in quantized}) > 1:
            raise ValueError(f"{name}: experts quantized differently cannot be stacked")
        biases = [p.biases for p in quantized if p.biases is not None]
        return StackedExperts(
            mx.stack([p.weight for p in quantized]),
            mx.stack([p.scales for p in quantized]),
            mx.stack(biases) if biases else None,
            quantized[0].spec,
        )

    def __call__(self, x: mx.array, ids: mx.array, sorted_ids: bool) -> mx.array:
        """x [..., 1, in] times expert `ids` (broadcast against x's batch dims) -> [..., 1, out]."""
        spec = self.spec
        if spec is None:
            weight = self.weight.swapaxes(-1, -2)
            out = mx.gather_mm(
                x.astype(weight.dtype), weight, rhs_indices=ids, sorted_indices=sorted_ids
            )
            return out.astype(x.dtype)
        assert self.scales is not None
        return mx.gather_qmm(
            x,
            self.weight,
            self.scales,
            self.biases,
            rhs_indices=ids,
            transpose=True,
            group_size=spec.group_size,
            bits=spec.bits,
            mode=spec.mode,
            sorted_indices=sorted_ids,
        )

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.weight, self.scales, self.biases) if a is not None]


class MoEBlock:
    gate_up_bias: mx.array | None = None  # [E, 2I], [E, H]: gpt-oss's experts have biases
    down_bias: mx.array | None = None

    def __init__(self, c: ModelConfig, prefix: str, w: WeightReader) -> None:
        hidden, inter, experts = c.hidden_size, c.moe_intermediate_size, c.num_experts
        self.top_k, self.intermediate = c.num_experts_per_tok, inter
        self.norm_topk_prob = c.norm_topk_prob
        self.round_weights = c.model_type != "mixtral"  # Qwen3-MoE: weights in activation dtype
        self.router: Linear = w.linear(prefix + "gate.weight", (experts, hidden))
        p = prefix + "experts."
        if p + "gate_up_proj" in w:  # already stacked (transformers 5's in-memory names)
            stacked = w.take(p + "gate_up_proj", (experts, 2 * inter, hidden))
            self.gate_up = StackedExperts.dense(stacked)
            self.down = StackedExperts.dense(w.take(p + "down_proj", (experts, hidden, inter)))
            return
        gate_up = [
            w.linear(f"{p}{e}.{part}.weight", (inter, hidden))
            for e in range(experts)
            for part in ("gate_proj", "up_proj")
        ]
        # each expert's gate and up as one [2I, H] matrix: concatenated along the rows
        pairs = [fuse(gate_up[2 * e : 2 * e + 2]) for e in range(experts)]
        self.gate_up = StackedExperts.stack(pairs, p + "gate_up")
        down = [w.linear(f"{p}{e}.down_proj.weight", (hidden, inter)) for e in range(experts)]
        self.down = StackedExperts.stack(down, p + "down_proj")

    def arrays(self) -> list[mx.array]:
        out = self.router.arrays() + self.gate_up.arrays() + self.down.arrays()
        return out + [a for a in vars(self).values() if isinstance(a, mx.array)]

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """x [T, H] -> (weights [T, k], expert ids [T, k]), as transformers' router."""
        probs = mx.softmax(self.router(x).astype(mx.float32), axis=-1)
        ids = mx.argpartition(-probs, kth=self.top_k - 1, axis=-1)[:, : self.top_k]
        weights = mx.take_along_axis(probs, ids, axis=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        return (weights.astype(x.dtype) if self.round_weights else weights), ids

    def activate(self, h: mx.array) -> mx.array:
        """[..., 2I] gate and up projections -> [..., I]: SwiGLU."""
        gate, up = h[..., : self.intermediate], h[..., self.intermediate :]
        return gate * mx.sigmoid(gate) * up

    def __call__(self, x: mx.array) -> mx.array:
        """x [T, H] (post-attention-normed) -> [T, H]."""
        return self.combine(x, *self.route(x))

    def combine(self, x: mx.array, weights: mx.array, ids: mx.array) -> mx.array:
        """x [T, H] through each token's experts `ids` [T, k], summed by `weights` -> [T, H]."""
        tokens, k = ids.shape
        if ids.size < SORT_FROM:  # each token's row against its k experts: [T, k, 1, H]
            y = self._experts(x[:, None, None, :], ids, sorted_ids=False)[:, :, 0]
        else:  # (token, expert) pairs grouped by expert, then put back in order
            flat = ids.flatten()
            order = mx.argsort(flat)
            y = self._experts(x[order // k][:, None, :], flat[order], sorted_ids=True)
            y = y[mx.argsort(order)].reshape(tokens, k, -1)
        return (y * weights[..., None]).sum(axis=1).astype(x.dtype)

    def _experts(self, x: mx.array, ids: mx.array, sorted_ids: bool) -> mx.array:
        """x [..., 1, H] through the experts `ids` [...] -> [..., 1, H]."""
        h = self.gate_up(x, ids, sorted_ids)
        if self.gate_up_bias is not None:
            h = h + self.gate_up_bias[ids][..., None, :]
        y = self.down(self.activate(h), ids, sorted_ids)
        if self.down_bias is not None:
            y = y + self.down_bias[ids][..., None, :]
        return y
