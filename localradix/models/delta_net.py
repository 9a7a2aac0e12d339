"""The gated delta-net: Qwen3.5's linear-attention layer, over variable-length segments.

Per token: in-projections to q, k, v (through a causal depthwise conv1d and SiLU), a gate z,
beta = sigmoid(b) and a decay g = -exp(A_log) * softplus(a + dt_bias); q and k are L2-normed
(q also scaled by key_dim^-1/2) and each q/k head serves value_heads / key_heads consecutive
value heads. The state S [key_dim, value_dim] of each value head follows the delta rule

    S <- exp(g) S;   S <- S + beta k (v - k S)^T;   out = q S

and the output goes through an RMSNorm gated by SiLU(z) and the out projection. Decoding takes
that step directly (`delta_rule_step`, every one-token request of a batch at once); a longer
segment runs the chunked form (`chunked_delta_rule`: within a chunk, a triangular solve folds
the updates into matmuls; across chunks, the state is carried), starting from the request's
saved state. The math runs in float32. A step's requests are contiguous segments of the flat
token batch; their rows of conv and recurrent state are read and written through the runner's
`RecurrentStates` (`StepPlan`: which rows, which tokens).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from localradix.model_api.recurrent_plan import StepPlan
from localradix.model_api.recurrent_state import RecurrentStates
from localradix.models.config import ModelConfig

CHUNK = 64  # tokens per chunk of the chunked form
L2_EPS = 1e-6  # (the FLA library's and transformers')


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def causal_conv(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, plan: StepPlan
) -> torch.Tensor:
    """SiLU(causal depthwise conv) of x [T, C] with weight [C, K] (float32), each request's
    window starting in its row of `state` [rows, K - 1, C], which is moved on to its last
    K - 1 inputs. Summed in float32 and rounded once, as a convolution kernel does; a shifted
    gather per tap, which beats conv1d on the strided buffer (decode: by 10-100x on a CPU)."""
    channels, width = x.shape[1], weight.shape[1] - 1
    ext = x.new_empty(plan.ext_len, channels)
    ext[plan.state_at] = state.index_select(0, plan.rows).view(-1, channels)
    ext[plan.token_at] = x
    state.index_copy_(0, plan.rows, ext[plan.tail_at].view(-1, width, channels))
    out = ext[plan.conv_at].float() * weight[:, 0]
    for tap in range(1, width + 1):
        out.addcmul_(ext[plan.conv_at + tap], weight[:, tap])
    return F.silu(out.to(x.dtype))


def delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each of N requests: q, k [N, H, Dk], v [N, H, Dv], g, beta [N, H],
    state [N, H, Dk, Dv] (contiguous; updated in place) -> (out [N, H, Dv], state)."""
    state.mul_(g.exp()[..., None, None])
    predicted = (k.unsqueeze(-2) @ state).squeeze(-2)  # what the state recalls for k
    delta = (v - predicted) * beta.unsqueeze(-1)
    flat = state.view(-1, *state.shape[-2:])  # state += k delta^T, without a temporary
    flat.baddbmm_(k.reshape(-1, k.shape[-1], 1), delta.reshape(-1, 1, delta.shape[-1]))
    return (q.unsqueeze(-2) @ state).squeeze(-2), state


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's L tokens: q, k [L, H, Dk], v [L, H, Dv], g, beta [L, H], state
    [H, Dk, Dv] -> (out [L, H, Dv], the state after them). The tail is padded to whole chunks
    with tokens that change nothing (g = 0, beta = 0, k = 0)."""
    length, value_dim = q.shape[0], v.shape[-1]
    pad = -length % chunk
    n = (length + pad) // chunk

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [L, H, ...] -> [H, n, chunk, ...]
        x = x.movedim(0, 1)
        x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
        return x.reshape(x.shape[0], n, chunk, *x.shape[2:])

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))
    decay = g.cumsum(-1)  # [H, n, C]: log of the decay from the chunk's start to each token
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # pair[i, j]: the decay from token j to token i of a chunk (j <= i), else 0
    pair = (decay.unsqueeze(-1) - decay.unsqueeze(-2)).masked_fill(~causal, -torch.inf).exp()
    k_beta = k * beta.unsqueeze(-1)
    # Within a chunk the updates chain: (I + strictly_lower(beta K K^T * pair)) [U W] =
    # [beta V, beta K exp(decay)] gives the new values U (before the state's share is taken
    # off) and W, what the state at the chunk's start contributes to them.
    system = (k_beta @ k.transpose(-1, -2)) * pair
    rhs = torch.cat([v * beta.unsqueeze(-1), k_beta * decay.exp().unsqueeze(-1)], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    new_values, from_state = solved.split([value_dim, k.shape[-1]], dim=-1)
    scores = (q @ k.transpose(-1, -2)) * pair  # within-chunk attention
    q_decayed = q * decay.exp().unsqueeze(-1)  # reads the state at the chunk's start
    k_decayed = k * (decay[..., -1:] - decay).exp().unsqueeze(-1)  # writes it at its end
    chunk_decay = decay[..., -1].exp()[..., None, None]  # [H, n, 1, 1]
    out = torch.empty_like(new_values)
    for i in range(n):
        values = new_values[:, i] - from_state[:, i] @ state
        out[:, i] = q_decayed[:, i] @ state + scores[:, i] @ values
        state = state * chunk_decay[:, i] + k_decayed[:, i].transpose(-1, -2) @ values
    return out.reshape(out.shape[0], n * chunk, value_dim)[:, :length].movedim(0, 1), state


class GatedDeltaNet(nn.Module):
    """Qwen3.5's `linear_attn` block: x [T, hidden] -> [T, hidden] (no residual)."""

    def __init__(
        self,
        config: ModelConfig,
        index: int,  # among the linear-attention layers (the state's layer)
        new: Callable[..., nn.Parameter],
    ) -> None:
        super().__init__()
        c = config
        self.index, self.eps = index, c.rms_norm_eps
        self.key_heads, self.value_heads = c.linear_key_heads, c.linear_value_heads
        self.key_dim, self.value_dim = c.linear_key_head_dim, c.linear_value_head_dim
        keys, values = self.key_heads * self.key_dim, self.value_heads * self.value_dim
        self.splits = (2 * keys + values, values, self.value_heads, self.value_heads)
        # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a as one matmul
        self.in_weight = new(sum(self.splits), c.hidden_size)
        self.conv_weight = new(2 * keys + values, c.linear_conv_kernel)
        self.dt_bias = new(self.value_heads)
        self.A_log = new(self.value_heads)
        self.norm = new(self.value_dim)
        self.out_weight = new(c.hidden_size, values)
        self.neg_a: torch.Tensor | None = None  # -exp(A_log) in float32, by finalize()
        self.conv_taps: torch.Tensor | None = None  # conv_weight in float32, by finalize()

    def finalize(self) -> None:
        self.neg_a = -self.A_log.detach().float().exp()
        self.conv_taps = self.conv_weight.detach().float()

    def forward(self, x: torch.Tensor, states: RecurrentStates) -> torch.Tensor:
        plan = states.plan
        assert plan is not None and self.neg_a is not None and self.conv_taps is not None
        tokens, dtype = x.shape[0], x.dtype
        qkv, z, b, a = F.linear(x, self.in_weight).split(self.splits, dim=-1)
        qkv = causal_conv(qkv, self.conv_taps, states.conv[self.index], plan)
        keys = self.key_heads * self.key_dim
        q, k, v = qkv.split([keys, keys, self.value_heads * self.value_dim], dim=-1)
        q = l2_normalize(q.reshape(tokens, self.key_heads, self.key_dim).float())
        k = l2_normalize(k.reshape(tokens, self.key_heads, self.key_dim).float())
        if self.value_heads != self.key_heads:
            group = self.value_heads // self.key_heads
            q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
        q = q * self.key_dim**-0.5
        v = v.reshape(tokens, self.value_heads, self.value_dim).float()
        beta = b.sigmoid().float()
        g = self.neg_a * F.softplus(a.float() + self.dt_bias)
        out = self._delta_rule(q, k, v, g, beta, states.recurrent[self.index], plan)
        z = z.reshape(tokens, self.value_heads, self.value_dim)
        return F.linear(self._gated_norm(out.to(dtype), z).reshape(tokens, -1), self.out_weight)

    @staticmethod
    def _delta_rule(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        recurrent: torch.Tensor,  # [rows, H, Dk, Dv]: read and moved on
        plan: StepPlan,
    ) -> torch.Tensor:
        if not plan.segments:  # decode only (or prefills of one token)
            state = recurrent.index_select(0, plan.rows)
            out, state = delta_rule_step(q, k, v, g, beta, state)
            recurrent.index_copy_(0, plan.rows, state)
            return out
        out = torch.empty_like(v)
        if plan.single_tokens is not None and plan.single_rows is not None:
            t, rows = plan.single_tokens, plan.single_rows
            state = recurrent.index_select(0, rows)
            out[t], state = delta_rule_step(q[t], k[t], v[t], g[t], beta[t], state)
            recurrent.index_copy_(0, rows, state)
        for row, start, length in plan.segments:
            span = slice(start, start + length)
            out[span], state = chunked_delta_rule(
                q[span], k[span], v[span], g[span], beta[span], recurrent[row]
            )
            recurrent[row] = state
        return out

    def _gated_norm(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """RMSNorm of each head's output (weight w, not 1 + w) times SiLU(gate), as
        transformers' `RMSNormGated` rounds it."""
        normed = F.rms_norm(x.float(), (self.value_dim,), None, self.eps).to(x.dtype) * self.norm
        return (normed * F.silu(gate.float())).to(x.dtype)
