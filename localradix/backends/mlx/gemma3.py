"""Gemma 3 text models on MLX (twin of models/gemma3.py): the decoder's blocks (model.py) with
Gemma's differences:

- RMSNorms scale by (1 + weight), computed in float32 and cast back, and every layer has four:
  before and after attention, before and after the MLP (both outputs normed before the residual);
- a GeGLU MLP (`hidden_activation`, tanh-approximated GELU by default);
- embeddings multiplied by sqrt(hidden_size), rounded to the model dtype as transformers does;
- attention scaled by `query_pre_attn_scalar ** -0.5`;
- sliding-window layers (the paged attention applies `ModelConfig.layer_windows()`) rotate with
  the local RoPE base, full-attention layers with the global one and its scaling;
- optional final-logit soft-capping (Gemma 3 leaves it off).
"""

from __future__ import annotations

import math

import mlx.core as mx

from localradix.backends.mlx.attention import MLXPagedAttention
from localradix.backends.mlx.model import DecoderLayer, MLXDecoderForCausalLM, float32_norm
from localradix.backends.mlx.reader import WeightReader
from localradix.backends.mlx.rope import Rotary
from localradix.models.config import ModelConfig, RopeScaling


def _gelu_tanh(x: mx.array) -> mx.array:
    return 0.5 * x * (1 + mx.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _gelu(x: mx.array) -> mx.array:
    return 0.5 * x * (1 + mx.erf(x / math.sqrt(2)))


_GELU = {"gelu_pytorch_tanh": _gelu_tanh, "gelu_tanh": _gelu_tanh, "gelu": _gelu}


class Gemma3Layer(DecoderLayer):
    norm = staticmethod(float32_norm)  # (its weights: 1 + w in float32)

    def __init__(self, c: ModelConfig, layer_id: int, w: WeightReader) -> None:
        if c.hidden_act not in _GELU:
            raise ValueError(f"Gemma 3 with hidden_activation {c.hidden_act!r} is not supported")
        super().__init__(c, layer_id, w)
        p = f"model.layers.{layer_id}."
        self.gelu = _GELU[c.hidden_act]
        self.window = c.windows[layer_id] if c.windows else 0
        self.scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
        # the four norms' and q/k's float32 (1 + w), in place of the checkpoint's w
        self.input_norm, self.post_norm = _plus_one(self.input_norm), _plus_one(self.post_norm)
        ff = [
            w.take(f"{p}{n}_feedforward_layernorm.weight", (c.hidden_size,))
            for n in ("pre", "post")
        ]
        self.pre_ff_norm, self.post_ff_norm = _plus_one(ff[0]), _plus_one(ff[1])
        assert self.q_norm is not None and self.k_norm is not None  # (Gemma 3 always has them)
        self.q_norm, self.k_norm = _plus_one(self.q_norm), _plus_one(self.k_norm)

    def activate(self, gate: mx.array, up: mx.array) -> mx.array:
        return self.gelu(gate) * up  # GeGLU

    def gemma_forward(
        self, x: mx.array, cos: mx.array, sin: mx.array, attn: MLXPagedAttention
    ) -> mx.array:
        """x [T, hidden] -> the layer's output [T, hidden] (residuals added)."""
        h = self.o_proj(self.attention(self.norm(x, self.input_norm, self.eps), cos, sin, attn))
        x = x + self.norm(h, self.post_norm, self.eps)
        h = self.mlp(self.norm(x, self.pre_ff_norm, self.eps))
        return x + self.norm(h, self.post_ff_norm, self.eps)


class MLXGemma3ForCausalLM(MLXDecoderForCausalLM):
    layer_class = Gemma3Layer

    def setup(self, w: WeightReader) -> None:
        c = self.config
        if c.attn_logit_softcap:
            raise ValueError("attention logit soft-capping (Gemma 2) is not supported")
        self.embed_scale = mx.array(c.embed_scale, dtype=self.dtype)  # rounded, as transformers
        local_theta = c.local_rope_theta or c.rope_theta
        self.local_rotary = Rotary(c, self.dtype, theta=local_theta, scaling=RopeScaling())
        self.norm = _plus_one(self.norm)

    def forward(self, input_ids: mx.array, positions: mx.array, attn: MLXPagedAttention):
        x = self.embed_tokens.rows(input_ids) * self.embed_scale
        full, local = self.rotary.lookup(positions), self.local_rotary.lookup(positions)
        for layer in self.layers:
            assert isinstance(layer, Gemma3Layer)
            cos, sin = local if layer.window else full
            x = layer.gemma_forward(x, cos, sin, attn)
        return float32_norm(x, self.norm, self.config.rms_norm_eps)

    def compute_logits(self, hidden: mx.array) -> mx.array:
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_softcap
        return mx.tanh(logits / cap) * cap if cap else logits


def _plus_one(weight: mx.array) -> mx.array:
    return 1.0 + weight.astype(mx.float32)
