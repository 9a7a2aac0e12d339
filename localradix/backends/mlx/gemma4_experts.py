"""Gemma 4's MoE block on MLX (twin of models/gemma4.py's `Gemma4Experts`): beside each
layer's dense MLP, GeGLU experts fed the pre-normed residual and routed by the residual itself.

The router norms its input without a weight, times `scale` and 1/sqrt(hidden), softmaxes the
logits in float32, keeps the top k renormalised to sum to 1 and multiplies each by its
expert's `per_expert_scale`. The experts come stacked (`experts.gate_up_proj` [E, 2I, H],
`experts.down_proj` [E, H, I]; mlx-lm's conversions: `experts.switch_glu.{gate,up,down}_proj`,
float or quantized) and run through moe.py's gathered matmuls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import mlx.core as mx

from localradix.backends.mlx.moe import MoEBlock, StackedExperts
from localradix.backends.mlx.quant import Quantized
from localradix.backends.mlx.reader import WeightReader
from localradix.models.config import ModelConfig


def arrays_of(values: Iterable[object]) -> list[mx.array]:
    """The MLX arrays among `values`: arrays, dicts' and lists' arrays, and whatever objects
    with an `arrays()` method (linear layers, blocks) hold."""
    out: list[mx.array] = []
    for value in values:
        if isinstance(value, mx.array):
            out.append(value)
        elif isinstance(value, dict):
            out += arrays_of(value.values())
        elif isinstance(value, list | tuple):
            out += arrays_of(value)
        elif hasattr(value, "arrays"):
            out += value.arrays()
    return out


class Gemma4Experts(MoEBlock):
    def __init__(  # (its own names: not MoEBlock's)
        self,
        c: ModelConfig,
        prefix: str,
        w: WeightReader,
        gelu: Callable[[mx.array], mx.array],
    ) -> None:
        hidden, inter, experts = c.hidden_size, c.moe_intermediate_size, c.num_experts
        self.top_k, self.intermediate, self.gelu = c.num_experts_per_tok, inter, gelu
        self.eps, self.root = c.rms_norm_eps, hidden**-0.5
        self.router = w.linear(prefix + "router.proj.weight", (experts, hidden))
        self.scale = w.take(prefix + "router.scale", (hidden,))
        self.per_expert_scale = w.take(prefix + "router.per_expert_scale", (experts,))
        p = prefix + "experts."
        if p + "switch_glu.gate_proj.weight" in w:  # mlx-lm's conversion: gate and up apart
            p += "switch_glu."
            gate = _stacked(w, p + "gate_proj.weight", (experts, inter, hidden))
            up = _stacked(w, p + "up_proj.weight", (experts, inter, hidden))
            self.gate_up = _rows_joined(gate, up)
            self.down = _stacked(w, p + "down_proj.weight", (experts, hidden, inter))
            return
        self.gate_up = StackedExperts.dense(
            w.take(p + "gate_up_proj", (experts, 2 * inter, hidden))
        )
        self.down = StackedExperts.dense(w.take(p + "down_proj", (experts, hidden, inter)))

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """The residual x [T, H] -> (weights [T, k] in float32, expert ids [T, k])."""
        h = mx.fast.rms_norm(x.astype(mx.float32), None, self.eps).astype(x.dtype)
        probs = mx.softmax(self.router(h * self.scale * self.root).astype(mx.float32), axis=-1)
        ids = mx.argpartition(-probs, kth=self.top_k - 1, axis=-1)[:, : self.top_k]
        weights = mx.take_along_axis(probs, ids, axis=-1)
        weights = weights / weights.sum(axis=-1, keepdims=True)
        return weights * self.per_expert_scale[ids], ids

    def activate(self, h: mx.array) -> mx.array:
        gate, up = h[..., : self.intermediate], h[..., self.intermediate :]
        return self.gelu(gate) * up  # GeGLU

    def __call__(self, x: mx.array, routed: mx.array | None = None) -> mx.array:
        """x [T, H] (pre-normed) through the experts that `routed` (the residual; default x)
        picks -> [T, H]."""
        return self.combine(x, *self.route(x if routed is None else routed))


def _stacked(w: WeightReader, name: str, shape: tuple[int, int, int]) -> StackedExperts:
    """Stacked experts [E, out, in] as the checkpoint keeps them: float, or quantized."""
    array = w.weights.get(name)
    if not isinstance(array, Quantized):
        return StackedExperts.dense(w.take(name, shape))
    stored = (*array.weight.shape[:2], array.weight.shape[2] * 32 // array.spec.bits)
    if stored != shape:
        raise ValueError(f"{name}: checkpoint shape {stored}, model {shape}")
    w.used.add(name)
    return StackedExperts(array.weight, array.scales, array.biases, array.spec)


def _rows_joined(gate: StackedExperts, up: StackedExperts) -> StackedExperts:
    """[E, I, H] gate and up as one [E, 2I, H] (quantized rows join as they are: a row's
    groups run along `in`)."""
    if gate.spec != up.spec:
        raise ValueError("gate and up experts quantized differently")

    def join(a: mx.array | None, b: mx.array | None) -> mx.array | None:
        return None if a is None or b is None else mx.concatenate([a, b], axis=1)

    weight = mx.concatenate([gate.weight, up.weight], axis=1)
    return StackedExperts(
        weight, join(gate.scales, up.scales), join(gate.biases, up.biases), gate.spec
    )
