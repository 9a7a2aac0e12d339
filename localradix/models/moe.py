"""The mixture-of-experts MLP block of Mixtral and Qwen3-MoE, with no host sync in a step.

A router (`gate`) linear scores the experts; softmax over all of them in float32, the top-k
kept and (Mixtral always, Qwen3-MoE with `norm_topk_prob`) renormalised to sum to 1, as
transformers does. Qwen3-MoE then rounds the weights to the activation dtype, Mixtral keeps
them in float32. Each expert is a SwiGLU MLP; their weights are stacked at load into
`gate_up_weight` [E, 2I, H] (gate rows, then up rows) and `down_weight` [E, H, I].

transformers loops over the experts hit (`nonzero`, a data-dependent loop): a host sync per
layer, and shapes no CUDA graph can capture. Here every shape follows from the token count
alone, by one of two exact formulations:

- gather (decode-sized batches, T * k <= E): copy each token's k experts' weights
  (`index_select` -> [T, k, 2I, H]) and batch-matmul. It reads no more weight bytes than the
  dense way and does only the FLOPs needed.
- dense (prefill): run every expert on every token (two large matmuls) and combine with a
  [T, E] routing matrix that is zero outside each token's top-k: E/k times the FLOPs, but
  static shapes and no [T, k, 2I, H] copy, which would outgrow the weights themselves.
  Unselected experts' activations are replaced by 0 (not multiplied by it) before the down
  projection: one overflowing to inf in float16 would otherwise give NaN where transformers
  never computes it.

A subclass may change the routing (`route`) and the activation (`activate`), and give the
router and the experts biases (`biases=True`: `router_bias` [E], `gate_up_bias` [E, 2I],
`down_bias` [E, H]): gpt-oss's (`models/gpt_oss.py`).

Under tensor parallelism I is this rank's slice of every expert (`model_api/shard.py`): the
routing is the same on every rank and the output a partial sum, which the decoder all-reduces.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from localradix.models.config import ModelConfig


class MoEBlock(nn.Module):
    def __init__(
        self, config: ModelConfig, new: Callable[..., nn.Parameter], biases: bool = False
    ) -> None:
        super().__init__()
        c = config
        self.num_experts, self.top_k = c.num_experts, c.num_experts_per_tok
        self.intermediate = c.moe_intermediate_size
        self.norm_topk_prob = c.norm_topk_prob
        self.round_weights = c.model_type != "mixtral"  # Qwen3-MoE: weights in activation dtype
        self.router_weight = new(c.num_experts, c.hidden_size)
        self.router_bias = new(c.num_experts) if biases else None
        self.gate_up_weight = new(c.num_experts, 2 * c.moe_intermediate_size, c.hidden_size)
        self.down_weight = new(c.num_experts, c.hidden_size, c.moe_intermediate_size)
        self.gate_up_bias = new(c.num_experts, 2 * c.moe_intermediate_size) if biases else None
        self.down_bias = new(c.num_experts, c.hidden_size) if biases else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, k], expert ids [T, k]), as transformers' router."""
        probs = F.softmax(F.linear(x, self.router_weight).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.round_weights:
            weights = weights.to(x.dtype)
        return weights, ids

    def activate(self, h: torch.Tensor) -> torch.Tensor:
        """[..., 2I] gate and up projections -> [..., I]: SwiGLU."""
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] (post-attention-normed) -> [T, H]."""
        weights, ids = self.route(x)
        if x.shape[0] * self.top_k <= self.num_experts:
            out = self._gathered(x, weights, ids)
        else:
            out = self._dense(x, weights, ids)
        return out.to(x.dtype)

    def _gathered(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        tokens, k = ids.shape
        flat = ids.reshape(-1)
        gate_up = self.gate_up_weight.index_select(0, flat).view(
            tokens, k, 2 * self.intermediate, -1
        )
        h = torch.matmul(gate_up, x[:, None, :, None]).squeeze(-1)  # [T, k, 2I]
        if self.gate_up_bias is not None:
            h = h + self.gate_up_bias.index_select(0, flat).view(tokens, k, -1)
        down = self.down_weight.index_select(0, flat).view(tokens, k, -1, self.intermediate)
        y = torch.matmul(down, self.activate(h).unsqueeze(-1)).squeeze(-1)  # [T, k, H]
        if self.down_bias is not None:
            y = y + self.down_bias.index_select(0, flat).view(tokens, k, -1)
        return (y * weights.unsqueeze(-1)).sum(dim=1)

    def _dense(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        tokens, experts = x.shape[0], self.num_experts
        routing = weights.new_zeros(tokens, experts).scatter_(1, ids, weights)  # [T, E]
        chosen = torch.zeros_like(routing, dtype=torch.bool).scatter_(1, ids, True)
        all_experts = self.gate_up_weight.view(experts * 2 * self.intermediate, -1)
        bias = None if self.gate_up_bias is None else self.gate_up_bias.view(-1)
        h = F.linear(x, all_experts, bias).view(tokens, experts, 2 * self.intermediate)
        act = torch.where(chosen[:, :, None], self.activate(h), 0.0).transpose(0, 1)  # [E,T,I]
        y = torch.bmm(act, self.down_weight.transpose(1, 2))  # [E, T, H]
        if self.down_bias is not None:
            y = y + self.down_bias.unsqueeze(1)
        return (y * routing.t().unsqueeze(-1)).sum(dim=0)
