"""The gated delta-net on MLX: Qwen3.5's linear-attention layer over variable-length segments
(twin of models/delta_net.py; the math, in float32, is written out there).

Per token: in-projections to q, k, v (through a causal depthwise conv1d and SiLU), a gate z,
beta = sigmoid(b) and a decay g = -exp(A_log) * softplus(a + dt_bias); q and k L2-normed, q
scaled by key_dim^-1/2, each q/k head serving value_heads / key_heads value heads. Decodes take
one recurrent step together (`delta_rule_step`); a longer segment runs the chunked form
(`chunked_delta_rule`), whose within-chunk triangular solve runs on MLX's CPU stream (the only
one with `solve_triangular`; unified memory makes that a hop, not a copy). The conv and
recurrent state of each request's row is read and rewritten through `MLXRecurrentStates`.
"""

from __future__ import annotations

import mlx.core as mx

from localradix.backends.mlx.quant import Dense, Linear, Quantized, fuse
from localradix.backends.mlx.reader import WeightReader
from localradix.backends.mlx.recurrent_state import MLXRecurrentStates
from localradix.model_api.recurrent_plan import StepPlan
from localradix.models.config import ModelConfig

CHUNK = 64  # tokens per chunk of the chunked form
L2_EPS = 1e-6  # (transformers')


def silu(x: mx.array) -> mx.array:
    return x * mx.sigmoid(x)


def l2_normalize(x: mx.array) -> mx.array:
    return x * mx.rsqrt((x * x).sum(-1, keepdims=True) + L2_EPS)


def causal_conv(x: mx.array, taps: mx.array, conv: mx.array, plan: StepPlan) -> mx.array:
    """SiLU(causal depthwise conv) of x [T, C] with taps [C, K] (float32), each request's window
    starting in its row of `conv` [rows, K - 1, C], which moves on to its last K - 1 inputs."""
    channels, width = x.shape[1], taps.shape[1] - 1
    ext = mx.zeros((plan.ext_len, channels), dtype=x.dtype)
    ext[plan.state_at] = conv[plan.rows].reshape(-1, channels)
    ext[plan.token_at] = x
    conv[plan.rows] = ext[plan.tail_at].reshape(-1, width, channels)
    out = ext[plan.conv_at].astype(mx.float32) * taps[:, 0]
    for tap in range(1, width + 1):
        out = out + ext[plan.conv_at + tap] * taps[:, tap]
    return silu(out.astype(x.dtype))


def delta_rule_step(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One token of each of N requests: q, k [N, H, Dk], v [N, H, Dv], g, beta [N, H], state
    [N, H, Dk, Dv] -> (out [N, H, Dv], the new state)."""
    state = state * mx.exp(g)[..., None, None]
    predicted = (k[..., None, :] @ state)[..., 0, :]  # what the state recalls for k
    delta = (v - predicted) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return (q[..., None, :] @ state)[..., 0, :], state


def chunked_delta_rule(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    chunk: int = CHUNK,
) -> tuple[mx.array, mx.array]:
    """One request's L tokens: q, k [L, H, Dk], v [L, H, Dv], g, beta [L, H], state
    [H, Dk, Dv] -> (out [L, H, Dv], the state after them). The tail is padded to whole chunks
    with tokens that change nothing (g = 0, beta = 0, k = 0)."""
    length, value_dim = q.shape[0], v.shape[-1]
    pad = -length % chunk
    n = (length + pad) // chunk

    def chunks(x: mx.array) -> mx.array:  # [L, H, ...] -> [H, n, chunk, ...]
        x = mx.moveaxis(x, 0, 1)
        if pad:
            x = mx.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(x.shape[0], n, chunk, *x.shape[2:])

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))
    decay = mx.cumsum(g, axis=-1)  # [H, n, C]: log decay from the chunk's start to each token
    causal = mx.tril(mx.ones((chunk, chunk), dtype=mx.bool_))
    pair = mx.exp(mx.where(causal, decay[..., :, None] - decay[..., None, :], -mx.inf))
    k_beta = k * beta[..., None]
    # (I + strictly_lower(beta K K^T * pair)) [U W] = [beta V, beta K exp(decay)]: the chained
    # updates' new values U, and W, what the state at the chunk's start takes off them
    system = mx.tril((k_beta @ k.swapaxes(-1, -2)) * pair, k=-1) + mx.eye(chunk)
    rhs = mx.concatenate([v * beta[..., None], k_beta * mx.exp(decay)[..., None]], axis=-1)
    solved = mx.linalg.solve_triangular(system, rhs, upper=False, stream=mx.cpu)
    new_values, from_state = solved[..., :value_dim], solved[..., value_dim:]
    scores = (q @ k.swapaxes(-1, -2)) * pair  # within-chunk attention
    q_decayed = q * mx.exp(decay)[..., None]  # reads the state at the chunk's start
    k_decayed = k * mx.exp(decay[..., -1:] - decay)[..., None]  # writes it at its end
    chunk_decay = mx.exp(decay[..., -1])[..., None, None]  # [H, n, 1, 1]
    outs = []
    for i in range(n):
        values = new_values[:, i] - from_state[:, i] @ state
        outs.append(q_decayed[:, i] @ state + scores[:, i] @ values)
        state = state * chunk_decay[:, i] + k_decayed[:, i].swapaxes(-1, -2) @ values
    out = mx.stack(outs, axis=1).reshape(-1, n * chunk, value_dim)[:, :length]
    return mx.moveaxis(out, 0, 1), state


def permute_rows(layer: Linear, index: list[int]) -> Dense | Quantized:
    """A linear layer with its output rows reordered (quantized ones: packed rows alike)."""
    rows = mx.array(index)
    if isinstance(layer, Dense):
        return Dense(layer.weight[rows])
    if isinstance(layer, Quantized):
        biases = None if layer.biases is None else layer.biases[rows]
        return Quantized(layer.weight[rows], layer.scales[rows], biases, layer.spec, layer.dtype)
    raise ValueError("a fused projection quantized in parts cannot be regrouped")


class GatedDeltaNet:
    """Qwen3.5's `linear_attn`: x [T, hidden] -> [T, hidden] (no residual)."""

    def __init__(self, c: ModelConfig, index: int, prefix: str, w: WeightReader) -> None:
        self.index, self.eps = index, c.rms_norm_eps  # index: among the linear layers
        self.key_heads, self.value_heads = c.linear_key_heads, c.linear_value_heads
        self.key_dim, self.value_dim = c.linear_key_head_dim, c.linear_value_head_dim
        keys, values = self.key_heads * self.key_dim, self.value_heads * self.value_dim
        hidden, channels = c.hidden_size, 2 * keys + values
        self.splits = (channels, values, self.value_heads, self.value_heads)
        next_ = c.model_type == "qwen3_next"
        self.in_proj = (self._next_in_proj if next_ else self._in_proj)(prefix, w, hidden)
        kernel, name = c.linear_conv_kernel, prefix + "conv1d.weight"
        conv = w.take(name, (channels, 1, kernel), mx.float32)  # (mlx-lm's: mlx_lm_layout.py)
        self.conv_taps = conv.reshape(channels, kernel)
        self.dt_bias = w.take(prefix + "dt_bias", (self.value_heads,))
        self.neg_a = -mx.exp(w.take(prefix + "A_log", (self.value_heads,), mx.float32))
        self.norm = w.take(prefix + "norm.weight", (self.value_dim,))
        self.out_proj = w.linear(prefix + "out_proj.weight", (hidden, values))

    def _in_proj(self, prefix: str, w: WeightReader, hidden: int) -> Linear:
        """Qwen3.5's in_proj_qkv, _z, _b, _a as one matmul: [q; k; v; z; b; a] rows."""
        names = ("qkv", "z", "b", "a")
        parts = zip(names, self.splits, strict=True)
        return fuse([w.linear(f"{prefix}in_proj_{x}.weight", (rows, hidden)) for x, rows in parts])

    def _next_in_proj(self, prefix: str, w: WeightReader, hidden: int) -> Linear:
        """Qwen3-Next's fused projections, grouped per key head (its q, k, its value heads'
        v, z; then their b, a), regrouped into Qwen3.5's [q; k; v; z; b; a] rows."""
        heads, dim = self.key_heads, self.key_dim
        group = self.value_heads // heads  # value heads per key head
        per = group * self.value_dim
        width = 2 * dim + 2 * per
        offsets = [(0, dim), (dim, dim), (2 * dim, per), (2 * dim + per, per)]
        qkvz_rows = [h * width + o + i for o, n in offsets for h in range(heads) for i in range(n)]
        ba_rows = [
            h * 2 * group + o + i for o in (0, group) for h in range(heads) for i in range(group)
        ]
        qkvz = w.linear(prefix + "in_proj_qkvz.weight", (heads * width, hidden))
        ba = w.linear(prefix + "in_proj_ba.weight", (2 * self.value_heads, hidden))
        return fuse([permute_rows(qkvz, qkvz_rows), permute_rows(ba, ba_rows)])

    def arrays(self) -> list[mx.array]:
        out = self.in_proj.arrays() + self.out_proj.arrays()
        return out + [self.conv_taps, self.dt_bias, self.neg_a, self.norm]

    def __call__(self, x: mx.array, states: MLXRecurrentStates) -> mx.array:
        plan = states.plan
        assert plan is not None
        tokens, dtype = x.shape[0], x.dtype
        projected = self.in_proj(x)
        ends = [sum(self.splits[: i + 1]) for i in range(3)]
        qkv, z = projected[:, : ends[0]], projected[:, ends[0] : ends[1]]
        b, a = projected[:, ends[1] : ends[2]], projected[:, ends[2] :]
        qkv = causal_conv(qkv, self.conv_taps, states.conv[self.index], plan)
        keys = self.key_heads * self.key_dim
        q = l2_normalize(qkv[:, :keys].reshape(tokens, self.key_heads, -1).astype(mx.float32))
        k = qkv[:, keys : 2 * keys].reshape(tokens, self.key_heads, -1).astype(mx.float32)
        k = l2_normalize(k)
        if self.value_heads != self.key_heads:
            group = self.value_heads // self.key_heads
            q, k = mx.repeat(q, group, axis=1), mx.repeat(k, group, axis=1)
        q = q * self.key_dim**-0.5
        v = qkv[:, 2 * keys :].reshape(tokens, self.value_heads, -1).astype(mx.float32)
        beta = mx.sigmoid(b).astype(mx.float32)
        g = self.neg_a * mx.logaddexp(a.astype(mx.float32) + self.dt_bias, 0.0)  # softplus
        out = self._delta_rule(q, k, v, g, beta, states.recurrent[self.index], plan)
        z = z.reshape(tokens, self.value_heads, self.value_dim)
        return self.out_proj(self._gated_norm(out.astype(dtype), z).reshape(tokens, -1))

    @staticmethod
    def _delta_rule(
        q: mx.array,
        k: mx.array,
        v: mx.array,
        g: mx.array,
        beta: mx.array,
        recurrent: mx.array,  # [rows, H, Dk, Dv]: read and moved on
        plan: StepPlan,
    ) -> mx.array:
        if not plan.segments:  # decode only (or prefills of one token)
            out, recurrent[plan.rows] = delta_rule_step(q, k, v, g, beta, recurrent[plan.rows])
            return out
        out = mx.zeros_like(v)
        if plan.single_tokens is not None and plan.single_rows is not None:
            t, rows = plan.single_tokens, plan.single_rows
            out[t], recurrent[rows] = delta_rule_step(
                q[t], k[t], v[t], g[t], beta[t], recurrent[rows]
            )
        for row, start, length in plan.segments:
            span = slice(start, start + length)
            out[span], recurrent[row] = chunked_delta_rule(
                q[span], k[span], v[span], g[span], beta[span], recurrent[row]
            )
        return out

    def _gated_norm(self, x: mx.array, gate: mx.array) -> mx.array:
        """RMSNorm of each head's output (weight w, not 1 + w) times SiLU(gate), rounded as
        transformers' `RMSNormGated` rounds it."""
        normed = mx.fast.rms_norm(x.astype(mx.float32), None, self.eps).astype(x.dtype)
        return (normed * self.norm * silu(gate.astype(mx.float32))).astype(x.dtype)
