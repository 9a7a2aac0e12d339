"""One MLX decoder for the Llama family, Mistral, Qwen2 and Qwen3 (twin of models/decoder.py).

Same `ModelConfig`, same Hugging Face weight names, same math: fused qkv and gate_up matmuls,
q/k/v bias (Qwen2), per-head q/k RMSNorm (Qwen3), tied embeddings, GQA, RoPE theta/scaling.
Attention goes through the paged MLX attention, which owns the KV cache.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from localradix.backends.mlx.attention import MLXPagedAttention
from localradix.backends.mlx.rope import Rotary, apply_rotary
from localradix.models.config import ModelConfig

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
FREQ_FACTORS = "model.rotary_emb.freq_factors"  # GGUF `rope_freqs`


class _Weights:
    """Takes named arrays out of a checkpoint dict, checking shapes and coverage."""

    def __init__(self, weights: dict[str, mx.array], dtype: mx.Dtype) -> None:
        self.weights, self.dtype = weights, dtype
        self.used: set[str] = set()

    def take(self, name: str, shape: tuple[int, ...]) -> mx.array:
        if name not in self.weights:
            raise ValueError(f"checkpoint is missing weight {name!r}")
        array = self.weights[name]
        if tuple(array.shape) != shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(array.shape)}, model {shape}")
        self.used.add(name)
        return array.astype(self.dtype)

    def optional(self, name: str, shape: tuple[int, ...]) -> mx.array | None:
        return self.take(name, shape) if name in self.weights else None

    def check_all_used(self) -> None:
        extra = sorted(
            n for n in self.weights if n not in self.used and not n.endswith(_IGNORED_SUFFIXES)
        )
        extra = [n for n in extra if n not in ("lm_head.weight", FREQ_FACTORS)]
        if extra:
            shown = ", ".join(extra[:8]) + (" ..." if len(extra) > 8 else "")
            raise ValueError(f"unexpected weights in checkpoint: {shown}")


class DecoderLayer:
    def __init__(self, c: ModelConfig, layer_id: int, w: _Weights) -> None:
        p = f"model.layers.{layer_id}."
        hidden, inter = c.hidden_size, c.intermediate_size
        self.layer_id = layer_id
        self.eps = c.rms_norm_eps
        self.head_dim = c.head_dim
        self.q_size, self.kv_size = c.q_size, c.kv_size
        self.scale = c.head_dim**-0.5
        self.input_norm = w.take(p + "input_layernorm.weight", (hidden,))
        self.post_norm = w.take(p + "post_attention_layernorm.weight", (hidden,))
        proj = [("q", c.q_size), ("k", c.kv_size), ("v", c.kv_size)]
        self.qkv_weight = mx.concatenate(
            [w.take(f"{p}self_attn.{x}_proj.weight", (n, hidden)) for x, n in proj]
        )
        self.qkv_bias = (
            mx.concatenate([w.take(f"{p}self_attn.{x}_proj.bias", (n,)) for x, n in proj])
            if c.attention_bias
            else None
        )
        self.q_norm = w.take(p + "self_attn.q_norm.weight", (c.head_dim,)) if c.qk_norm else None
        self.k_norm = w.take(p + "self_attn.k_norm.weight", (c.head_dim,)) if c.qk_norm else None
        self.o_weight = w.take(p + "self_attn.o_proj.weight", (hidden, c.q_size))
        self.gate_up_weight = mx.concatenate(
            [
                w.take(p + "mlp.gate_proj.weight", (inter, hidden)),
                w.take(p + "mlp.up_proj.weight", (inter, hidden)),
            ]
        )
        self.down_weight = w.take(p + "mlp.down_proj.weight", (hidden, inter))
        self.intermediate_size = inter

    def __call__(
        self,
        x: mx.array,  # [T, hidden]: previous layer's output (or the embeddings)
        residual: mx.array | None,  # [T, hidden]: running residual stream
        cos: mx.array,  # [T, 1, D]
        sin: mx.array,  # [T, 1, D]
        attn: MLXPagedAttention,
    ) -> tuple[mx.array, mx.array]:
        residual = x if residual is None else x + residual
        h = mx.fast.rms_norm(residual, self.input_norm, self.eps)
        qkv = h @ self.qkv_weight.T  # [T, (Hq + 2 Hkv) D]
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        tokens = qkv.shape[0]
        q = qkv[:, : self.q_size].reshape(tokens, -1, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(tokens, -1, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].reshape(tokens, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = mx.fast.rms_norm(q, self.q_norm, self.eps)
            k = mx.fast.rms_norm(k, self.k_norm, self.eps)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = attn.forward(q, k, v, self.layer_id, self.scale)
        residual = o @ self.o_weight.T + residual
        h = mx.fast.rms_norm(residual, self.post_norm, self.eps)
        gate_up = h @ self.gate_up_weight.T
        gate, up = gate_up[:, : self.intermediate_size], gate_up[:, self.intermediate_size :]
        return (gate * mx.sigmoid(gate) * up) @ self.down_weight.T, residual


class MLXDecoderForCausalLM:
    """forward(input_ids [T], positions [T], attn) -> hidden [T, H]; compute_logits -> fp32."""

    def __init__(self, config: ModelConfig, weights: dict[str, mx.array], dtype: mx.Dtype):
        self.config = config
        self.dtype = dtype
        w = _Weights(weights, dtype)
        vocab, hidden = config.vocab_size, config.hidden_size
        self.embed_tokens = w.take("model.embed_tokens.weight", (vocab, hidden))
        self.layers = [DecoderLayer(config, i, w) for i in range(config.num_hidden_layers)]
        self.norm = w.take("model.norm.weight", (hidden,))
        self.lm_head = (
            None if config.tie_word_embeddings else w.take("lm_head.weight", (vocab, hidden))
        )
        factors = weights.get(FREQ_FACTORS)
        freq = None if factors is None else np.array(factors.astype(mx.float32))
        self.rotary = Rotary(config, dtype, freq)
        w.check_all_used()
        mx.eval(self.parameters())

    def parameters(self) -> list[mx.array]:
        arrays = [self.embed_tokens, self.norm] + ([] if self.lm_head is None else [self.lm_head])
        for layer in self.layers:
            arrays += [a for a in vars(layer).values() if isinstance(a, mx.array)]
        return arrays

    def forward(self, input_ids: mx.array, positions: mx.array, attn: MLXPagedAttention):
        x = self.embed_tokens[input_ids]
        cos, sin = self.rotary.lookup(positions)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, cos, sin, attn)
        assert residual is not None
        return mx.fast.rms_norm(x + residual, self.norm, self.config.rms_norm_eps)

    def compute_logits(self, hidden: mx.array) -> mx.array:
        """hidden [N, H] (usually each request's last token) -> float32 logits [N, vocab]."""
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        return (hidden @ weight.T).astype(mx.float32)
