"""One MLX decoder for the Llama family, Mistral, Qwen2 and Qwen3 (twin of models/decoder.py).

Same `ModelConfig`, same Hugging Face weight names, same math: fused qkv and gate_up matmuls,
q/k/v bias (Qwen2), per-head q/k RMSNorm (Qwen3), tied embeddings, GQA, RoPE theta/scaling.
Attention goes through the paged MLX attention, which owns the KV cache. Linear layers and the
embedding are float or MLX-quantized (quant.py), whichever the checkpoint holds.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from localradix.backends.mlx.attention import MLXPagedAttention
from localradix.backends.mlx.quant import Dense, Linear, Quantized, fuse
from localradix.backends.mlx.rope import Rotary, apply_rotary
from localradix.models.config import ModelConfig

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
FREQ_FACTORS = "model.rotary_emb.freq_factors"  # GGUF `rope_freqs`


class _Weights:
    """Takes named arrays out of a checkpoint dict, checking shapes and coverage."""

    def __init__(self, weights: dict[str, mx.array | Quantized], dtype: mx.Dtype) -> None:
        self.weights, self.dtype = weights, dtype
        self.used: set[str] = set()

    def take(self, name: str, shape: tuple[int, ...]) -> mx.array:
        if name not in self.weights:
            raise ValueError(f"checkpoint is missing weight {name!r}")
        array = self.weights[name]
        if isinstance(array, Quantized):
            raise ValueError(f"{name} is quantized; only linear layers and embeddings may be")
        if tuple(array.shape) != shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(array.shape)}, model {shape}")
        self.used.add(name)
        return array.astype(self.dtype)

    def linear(self, name: str, shape: tuple[int, int]) -> Dense | Quantized:
        """A [out, in] matrix: float (in the model dtype) or quantized as stored."""
        array = self.weights.get(name)
        if not isinstance(array, Quantized):
            return Dense(self.take(name, shape))
        array.check(name)
        if array.shape != shape:
            raise ValueError(f"{name}: checkpoint shape {array.shape}, model {shape}")
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
        self.qkv = fuse([w.linear(f"{p}self_attn.{x}_proj.weight", (n, hidden)) for x, n in proj])
        self.qkv_bias = (
            mx.concatenate([w.take(f"{p}self_attn.{x}_proj.bias", (n,)) for x, n in proj])
            if c.attention_bias
            else None
        )
        self.q_norm = w.take(p + "self_attn.q_norm.weight", (c.head_dim,)) if c.qk_norm else None
        self.k_norm = w.take(p + "self_attn.k_norm.weight", (c.head_dim,)) if c.qk_norm else None
        self.o_proj = w.linear(p + "self_attn.o_proj.weight", (hidden, c.q_size))
        self.gate_up = fuse(
            [
                w.linear(p + "mlp.gate_proj.weight", (inter, hidden)),
                w.linear(p + "mlp.up_proj.weight", (inter, hidden)),
            ]
        )
        self.down_proj = w.linear(p + "mlp.down_proj.weight", (hidden, inter))
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
        qkv = self.qkv(h)  # [T, (Hq + 2 Hkv) D]
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
        residual = self.o_proj(o) + residual
        h = mx.fast.rms_norm(residual, self.post_norm, self.eps)
        gate_up = self.gate_up(h)
        gate, up = gate_up[:, : self.intermediate_size], gate_up[:, self.intermediate_size :]
        return self.down_proj(gate * mx.sigmoid(gate) * up), residual


class MLXDecoderForCausalLM:
    """forward(input_ids [T], positions [T], attn) -> hidden [T, H]; compute_logits -> fp32."""

    def __init__(
        self, config: ModelConfig, weights: dict[str, mx.array | Quantized], dtype: mx.Dtype
    ):
        self.config = config
        self.dtype = dtype
        w = _Weights(weights, dtype)
        vocab, hidden = config.vocab_size, config.hidden_size
        self.embed_tokens = w.linear("model.embed_tokens.weight", (vocab, hidden))
        self.layers = [DecoderLayer(config, i, w) for i in range(config.num_hidden_layers)]
        self.norm = w.take("model.norm.weight", (hidden,))
        self.lm_head = (
            None if config.tie_word_embeddings else w.linear("lm_head.weight", (vocab, hidden))
        )
        factors = weights.get(FREQ_FACTORS)
        freq = None if not isinstance(factors, mx.array) else np.array(factors.astype(mx.float32))
        self.rotary = Rotary(config, dtype, freq)
        w.check_all_used()
        mx.eval(self.parameters())

    def parameters(self) -> list[mx.array]:
        arrays = [self.norm] + self.embed_tokens.arrays()
        arrays += [] if self.lm_head is None else self.lm_head.arrays()
        for layer in self.layers:
            for value in vars(layer).values():
                if isinstance(value, mx.array):
                    arrays.append(value)
                elif isinstance(value, Linear):
                    arrays += value.arrays()
        return arrays

    @property
    def weight_bytes(self) -> int:
        """Bytes the resident weights take (quantized ones at their packed size)."""
        return sum(a.nbytes for a in self.parameters())

    def forward(self, input_ids: mx.array, positions: mx.array, attn: MLXPagedAttention):
        x = self.embed_tokens.rows(input_ids)
        cos, sin = self.rotary.lookup(positions)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, cos, sin, attn)
        assert residual is not None
        return mx.fast.rms_norm(x + residual, self.norm, self.config.rms_norm_eps)

    def compute_logits(self, hidden: mx.array) -> mx.array:
        """hidden [N, H] (usually each request's last token) -> float32 logits [N, vocab]."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return head(hidden).astype(mx.float32)
