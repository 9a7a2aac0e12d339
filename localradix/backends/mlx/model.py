"""One MLX decoder for the Llama family, Mistral, Qwen2, Qwen3, Phi-3/4, SmolLM3, Mixtral and
Qwen3-MoE (twin of models/decoder.py).

Same `ModelConfig`, same Hugging Face weight names, same math: fused qkv and gate_up matmuls
(Phi-3 checkpoints store them fused already), q/k/v bias (Qwen2), per-head q/k RMSNorm (Qwen3),
tied embeddings, GQA, RoPE theta/scaling (longrope: Phi-3), partial RoPE (Phi-4-mini), layers
without RoPE (SmolLM3), a mixture-of-experts MLP (moe.py: Mixtral, Qwen3-MoE, some of whose
layers stay dense). Attention goes through the paged MLX attention, which owns the KV cache.
Linear layers and the embedding are float or MLX-quantized (quant.py), whichever the
checkpoint holds. Gemma 3 (gemma3.py) and gpt-oss (gpt_oss.py) reuse the blocks with their own
norms, MLP or experts, and attention extras (a window per layer, sinks).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from localradix.backends.mlx.attention import MLXPagedAttention
from localradix.backends.mlx.moe import MoEBlock
from localradix.backends.mlx.quant import Linear, Quantized, fuse
from localradix.backends.mlx.reader import FREQ_FACTORS, WeightReader
from localradix.backends.mlx.rope import Rotary, apply_rotary
from localradix.models.config import ModelConfig


def rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, weight, eps)


def float32_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    """RMSNorm in float32 times a float32 weight, cast back (Gemma's with 1 + w, gpt-oss's)."""
    return mx.fast.rms_norm(x.astype(mx.float32), weight, eps).astype(x.dtype)


def fused_linear(
    w: WeightReader, fused: str | None, parts: list[tuple[str, int]], hidden: int
) -> Linear:
    """Row-stacked projections: the checkpoint's fused matrix `fused` (Phi-3's qkv_proj /
    gate_up_proj, in our row order) when given, else its `parts` (name, rows) fused at load."""
    if fused is not None:
        return w.linear(fused, (sum(rows for _, rows in parts), hidden))
    return fuse([w.linear(name, (rows, hidden)) for name, rows in parts])


class DecoderLayer:
    moe_class: type[MoEBlock] = MoEBlock  # (a family's own experts: gpt_oss.py)
    norm = staticmethod(rms_norm)  # (x, weight, eps); gpt-oss's and Gemma's run in float32
    sinks: mx.array | None = None  # [Hq] attention sink logits (gpt-oss)

    def __init__(self, c: ModelConfig, layer_id: int, w: WeightReader) -> None:
        p = f"model.layers.{layer_id}."
        hidden = c.hidden_size
        self.layer_id = layer_id
        self.eps = c.rms_norm_eps
        self.head_dim = c.head_dim
        self.q_size, self.kv_size = c.q_size, c.kv_size
        self.scale = c.head_dim**-0.5
        self.rope = c.uses_rope(layer_id)  # SmolLM3's NoPE layers see no positions
        self.input_norm = w.take(p + "input_layernorm.weight", (hidden,))
        self.post_norm = w.take(p + "post_attention_layernorm.weight", (hidden,))
        fused = c.fused_qkv_gate_up
        rows = {"q": c.q_size, "k": c.kv_size, "v": c.kv_size}
        qkv = [(f"{p}self_attn.{x}_proj.weight", n) for x, n in rows.items()]
        self.qkv = fused_linear(w, p + "self_attn.qkv_proj.weight" if fused else None, qkv, hidden)
        self.qkv_bias = (
            mx.concatenate([w.take(f"{p}self_attn.{x}_proj.bias", (n,)) for x, n in rows.items()])
            if c.attention_bias
            else None
        )
        self.q_norm = w.take(p + "self_attn.q_norm.weight", (c.head_dim,)) if c.qk_norm else None
        self.k_norm = w.take(p + "self_attn.k_norm.weight", (c.head_dim,)) if c.qk_norm else None
        self.o_proj = w.linear(p + "self_attn.o_proj.weight", (hidden, c.q_size))
        self.moe = self.moe_class(c, p + "mlp.", w) if c.uses_moe(layer_id) else None
        self.intermediate_size = inter = c.intermediate_size
        self.gate_up: Linear | None = None
        self.down_proj: Linear | None = None
        if self.moe is None:
            gate_up = [(p + "mlp.gate_proj.weight", inter), (p + "mlp.up_proj.weight", inter)]
            fused_name = p + "mlp.gate_up_proj.weight" if fused else None
            self.gate_up = fused_linear(w, fused_name, gate_up, hidden)
            self.down_proj = w.linear(p + "mlp.down_proj.weight", (hidden, inter))

    def arrays(self) -> list[mx.array]:
        out: list[mx.array] = []
        for value in vars(self).values():
            if isinstance(value, mx.array):
                out.append(value)
            elif isinstance(value, list):
                out += [v for v in value if isinstance(v, mx.array)]
            elif hasattr(value, "arrays"):  # Linear layers, the MoE block
                out += value.arrays()
        return out

    def norm_qk(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        """Per-head q/k RMSNorm (Qwen3; Gemma 3's in float32 with 1 + w)."""
        if self.q_norm is None or self.k_norm is None:
            return q, k
        return self.norm(q, self.q_norm, self.eps), self.norm(k, self.k_norm, self.eps)

    def attention(
        self, h: mx.array, cos: mx.array, sin: mx.array, attn: MLXPagedAttention
    ) -> mx.array:
        """Normed hidden states [T, hidden] -> attention output before o_proj [T, Hq * D]."""
        qkv = self.qkv(h)  # [T, (Hq + 2 Hkv) D]
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        tokens = qkv.shape[0]
        q = qkv[:, : self.q_size].reshape(tokens, -1, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(tokens, -1, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].reshape(tokens, -1, self.head_dim)
        q, k = self.norm_qk(q, k)
        if self.rope:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return attn.forward(q, k, v, self.layer_id, self.scale, self.sinks)

    def activate(self, gate: mx.array, up: mx.array) -> mx.array:
        return gate * mx.sigmoid(gate) * up  # SwiGLU

    def mlp(self, h: mx.array) -> mx.array:
        if self.moe is not None:
            return self.moe(h)
        assert self.gate_up is not None and self.down_proj is not None
        gate_up = self.gate_up(h)
        gate, up = gate_up[:, : self.intermediate_size], gate_up[:, self.intermediate_size :]
        return self.down_proj(self.activate(gate, up))

    def __call__(
        self,
        x: mx.array,  # [T, hidden]: previous layer's output (or the embeddings)
        residual: mx.array | None,  # [T, hidden]: running residual stream
        cos: mx.array,  # [T, 1, rotary_dim]
        sin: mx.array,
        attn: MLXPagedAttention,
    ) -> tuple[mx.array, mx.array]:
        residual = x if residual is None else x + residual
        h = self.norm(residual, self.input_norm, self.eps)
        residual = self.output(self.attention(h, cos, sin, attn)) + residual
        h = self.norm(residual, self.post_norm, self.eps)
        return self.mlp(h), residual

    def output(self, o: mx.array) -> mx.array:
        """The attention output projection (gpt-oss's has a bias)."""
        return self.o_proj(o)


class MLXDecoderForCausalLM:
    """forward(input_ids [T], positions [T], attn) -> hidden [T, H]; compute_logits -> fp32."""

    layer_class: type[DecoderLayer] = DecoderLayer
    final_norm = staticmethod(rms_norm)

    def __init__(
        self, config: ModelConfig, weights: dict[str, mx.array | Quantized], dtype: mx.Dtype
    ):
        self.config = config
        self.dtype = dtype
        w = WeightReader(weights, dtype)
        vocab, hidden = config.vocab_size, config.hidden_size
        self.embed_tokens = w.linear("model.embed_tokens.weight", (vocab, hidden))
        self.layers = [self.layer_class(config, i, w) for i in range(config.num_hidden_layers)]
        self.norm = w.take("model.norm.weight", (hidden,))
        self.lm_head = (
            None if config.tie_word_embeddings else w.linear("lm_head.weight", (vocab, hidden))
        )
        factors = weights.get(FREQ_FACTORS)
        freq = None if not isinstance(factors, mx.array) else np.array(factors.astype(mx.float32))
        self.rotary = Rotary(config, dtype, freq)
        self.setup(w)
        w.check_all_used()
        mx.eval(self.parameters())

    def setup(self, w: WeightReader) -> None:
        """A subclass's own weights and tables (Gemma 3)."""

    def parameters(self) -> list[mx.array]:
        arrays = [self.norm] + self.embed_tokens.arrays()
        arrays += [] if self.lm_head is None else self.lm_head.arrays()
        for layer in self.layers:
            arrays += layer.arrays()
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
        return self.final_norm(x + residual, self.norm, self.config.rms_norm_eps)

    def compute_logits(self, hidden: mx.array) -> mx.array:
        """hidden [N, H] (usually each request's last token) -> float32 logits [N, vocab]."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return head(hidden).astype(mx.float32)
