"""Gemma 3 text models (transformers' `Gemma3ForCausalLM`, `model_type` "gemma3_text").

The Llama-style decoder (`decoder.py`: fused qkv and gate_up weights, per-head q/k norm, the
same weight names and loader) with Gemma's differences:

- RMSNorms scale by (1 + weight), computed in float32 and cast back, and every layer has four:
  before and after attention, before and after the MLP (both outputs normed before the residual);
- a GeGLU MLP (`hidden_activation`, tanh-approximated GELU);
- embeddings multiplied by sqrt(hidden_size) in the model dtype;
- attention scaled by `query_pre_attn_scalar ** -0.5`;
- per-layer attention: sliding-window layers (applied by the attention backend, which the
  runner gives `ModelConfig.layer_windows()`) rotate with the local RoPE base, full-attention
  layers with the global one and its scaling;
- optional final-logit soft-capping (Gemma 3 leaves it off).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from localradix.model_api.attention import AttentionBackend
from localradix.model_api.tp_comm import SINGLE, TPComm
from localradix.models.config import ModelConfig, RopeScaling
from localradix.models.decoder import DecoderForCausalLM, DecoderLayer, _Factory
from localradix.models.rotary import RotaryTable

_GELU_APPROXIMATION = {"gelu_pytorch_tanh": "tanh", "gelu_tanh": "tanh", "gelu": "none"}


def gemma_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: in float32, times `weight` (already 1 + w, float32), cast back."""
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).mul_(weight).to(x.dtype)


def _plus_one(weight: torch.Tensor) -> torch.Tensor:
    return 1.0 + weight.detach().float()


class Gemma3Layer(DecoderLayer):
    def __init__(
        self, config: ModelConfig, layer_id: int, new: _Factory, tp: TPComm = SINGLE
    ) -> None:
        super().__init__(config, layer_id, new, tp)
        c = config
        if c.hidden_act not in _GELU_APPROXIMATION:
            raise ValueError(f"Gemma 3 with hidden_activation {c.hidden_act!r} is not supported")
        self.approximate = _GELU_APPROXIMATION[c.hidden_act]
        self.window = c.windows[layer_id] if c.windows else 0
        self.scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
        self.pre_ff_norm = new(c.hidden_size)
        self.post_ff_norm = new(c.hidden_size)
        self.norm_weights: list[torch.Tensor] = []  # float32 1 + w of the four norms

    def finalize(self) -> None:
        """Gemma's norm weights as float32 (1 + w), q's and k's stacked per head."""
        norms = (self.input_norm, self.post_norm, self.pre_ff_norm, self.post_ff_norm)
        self.norm_weights = [_plus_one(w) for w in norms]
        assert self.q_norm is not None and self.k_norm is not None
        num_kv = self.num_qk_heads - self.num_heads
        q = _plus_one(self.q_norm).expand(self.num_heads, -1)
        k = _plus_one(self.k_norm).expand(num_kv, -1)
        self.qk_norm_weight = torch.cat([q, k]).contiguous()

    def gemma_forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        """x [T, hidden] -> the layer's output [T, hidden] (residuals added)."""
        in_norm, post_norm, pre_ff_norm, post_ff_norm = self.norm_weights
        assert self.qk_norm_weight is not None and self.rotate is not None
        h = gemma_norm(x, in_norm, self.eps)
        qkv = F.linear(h, self.qkv_weight, self.qkv_bias)  # [T, (Hq + 2 Hkv) D]
        tokens = qkv.shape[0]
        qk = qkv[:, : self.qk_size].view(tokens, self.num_qk_heads, self.head_dim)
        qk = self.rotate(gemma_norm(qk, self.qk_norm_weight, self.eps), cos, sin)
        v = qkv[:, self.qk_size :].view(tokens, -1, self.head_dim)
        o = attn.forward(
            qk[:, : self.num_heads], qk[:, self.num_heads :], v, self.layer_id, self.scale
        )
        x = x + gemma_norm(self.tp.all_reduce(F.linear(o, self.o_weight)), post_norm, self.eps)
        h = gemma_norm(x, pre_ff_norm, self.eps)
        assert self.gate_up_weight is not None and self.down_weight is not None
        gate, up = F.linear(h, self.gate_up_weight).chunk(2, dim=-1)
        h = F.linear(F.gelu(gate, approximate=self.approximate) * up, self.down_weight)
        return x + gemma_norm(self.tp.all_reduce(h), post_ff_norm, self.eps)


class Gemma3ForCausalLM(DecoderForCausalLM):
    """forward(input_ids [T], positions [T], attn) -> hidden [T, H]; compute_logits -> fp32."""

    layer_class = Gemma3Layer

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
        tp: TPComm = SINGLE,
    ) -> None:
        if config.attn_logit_softcap:
            raise ValueError("attention logit soft-capping (Gemma 2) is not supported")
        super().__init__(config, dtype, device, max_positions, tp)
        c = self.config
        self.embed_scale = torch.tensor(c.embed_scale).to(dtype)  # rounded as transformers does
        self.final_cap = c.final_logit_softcap
        local = dataclasses.replace(
            c, rope_theta=c.local_rope_theta or c.rope_theta, rope_scaling=RopeScaling()
        )
        self.local_rotary = RotaryTable(local, dtype, self.device, max_positions)
        self.norm_weight = _plus_one(self.norm)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self._embed(input_ids) * self.embed_scale
        full = self.rotary.lookup(positions)
        local = self.local_rotary.lookup(positions)
        for layer in self.layers:
            assert isinstance(layer, Gemma3Layer)
            cos, sin = local if layer.window else full
            x = layer.gemma_forward(x, cos, sin, attn)
        return gemma_norm(x, self.norm_weight, self.eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        if self.final_cap:
            logits = torch.tanh(logits / self.final_cap) * self.final_cap
        return logits

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(weights)
        self.norm_weight = _plus_one(self.norm)
