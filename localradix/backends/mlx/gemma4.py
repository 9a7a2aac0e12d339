"""Gemma 4 text models on MLX (twin of models/gemma4.py, whose docstring lists the family's
differences from Gemma 3), with the same `ModelConfig` (`gemma4_config.py`) and weight names.

- Per-layer head sizes: sliding-window layers have `head_dim`, full-attention ones
  `global_head_dim` (and with keys as values fewer KV heads and no v_proj); the paged attention
  keeps one array of each KV layer's own shape (`KVLayout.layer_shapes`).
- KV-shared layers (the last `num_kv_shared_layers`) compute no K/V: they attend over this
  step's K/V of the last earlier layer of their type, under its KV id, and store nothing.
- Per-layer inputs, layer scalars, v_norm, proportional RoPE, soft-capped logits and the MoE
  block beside the dense MLP (gemma4_experts.py), computed as the torch model does.

A multimodal checkpoint's text weights (`model.language_model.`) are read as the text
model's; its vision and audio towers are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from localradix.backends.mlx.attention import MLXPagedAttention
from localradix.backends.mlx.gemma3 import _GELU
from localradix.backends.mlx.gemma4_experts import Gemma4Experts, arrays_of
from localradix.backends.mlx.model import MLXDecoderForCausalLM
from localradix.backends.mlx.quant import Dense, Linear, Quantized, fuse
from localradix.backends.mlx.reader import WeightReader
from localradix.backends.mlx.rope import apply_rotary
from localradix.models.config import ModelConfig
from localradix.models.gemma4_config import Gemma4Extras, Gemma4Rope

_IGNORED = re.compile(
    r"model\.(vision_tower|audio_tower|embed_vision|embed_audio)\..*|.*rotary_emb\..*"
)
KV = dict[int, tuple[mx.array, mx.array]]  # this step's K/V by KV layer, for shared layers


def norm(x: mx.array, weight: mx.array | None, eps: float) -> mx.array:
    """Gemma 4's RMSNorm: in float32, times `weight` (float32) if any, cast back."""
    return mx.fast.rms_norm(x.astype(mx.float32), weight, eps).astype(x.dtype)


class Gemma4Rotary:
    """cos / signed sin over a whole head for a step's positions; "proportional" leaves the
    frequency pairs past `partial * dim / 2` at 0 (unrotated), as transformers does."""

    def __init__(self, rope: Gemma4Rope, dim: int, dtype: mx.Dtype) -> None:
        half = dim // 2
        pairs = int(rope.partial * dim // 2) if rope.rope_type == "proportional" else half
        exponents = np.arange(0, 2 * pairs, 2, dtype=np.int64).astype(np.float32) / dim
        inv_freq = np.concatenate(
            [1.0 / (np.float32(rope.theta) ** exponents), np.zeros(half - pairs, np.float32)]
        )
        self.inv_freq = mx.array((inv_freq / np.float32(rope.factor)).astype(np.float32))
        self.dtype = dtype

    def lookup(self, positions: mx.array) -> tuple[mx.array, mx.array]:
        """cos, signed sin [T, 1, dim] in the model dtype."""
        freqs = positions.astype(mx.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = mx.cos(freqs), mx.sin(freqs)
        cos = mx.concatenate([cos, cos], axis=-1)[:, None, :]
        sin = mx.concatenate([-sin, sin], axis=-1)[:, None, :]
        return cos.astype(self.dtype), sin.astype(self.dtype)


class Gemma4Layer:
    def __init__(
        self,
        c: ModelConfig,
        g: Gemma4Extras,
        i: int,
        w: WeightReader,
        gelu: Callable[[mx.array], mx.array],
    ) -> None:
        p, hidden = f"model.layers.{i}.", c.hidden_size
        self.eps, self.gelu, self.sliding = c.rms_norm_eps, gelu, g.sliding[i]
        self.head_dim = d = c.head_dim if self.sliding else g.global_head_dim
        kv_heads = c.num_key_value_heads if self.sliding else g.global_kv_heads
        self.shared, self.kv_id = i >= g.first_shared, g.kv_sources[i]
        self.k_eq_v = g.k_eq_v and not self.sliding
        self.q_size, self.kv_size = c.num_attention_heads * d, kv_heads * d
        self._attention_weights(p, hidden, w)
        self.width = c.intermediate_size * (2 if g.double_wide_mlp and self.shared else 1)
        self.norms = {n: w.take(f"{p}{n}.weight", (hidden,), mx.float32) for n in _norms(c, g)}
        self._feedforward_weights(c, g, p, w)
        self.scalar = w.optional(p + "layer_scalar", (1,))  # (absent: 1)

    def _attention_weights(self, p: str, hidden: int, w: WeightReader) -> None:
        parts = [("q", self.q_size)]  # q, k and v (those the layer has) in one matmul
        parts += [] if self.shared else [("k", self.kv_size)]
        parts += [] if self.shared or self.k_eq_v else [("v", self.kv_size)]
        self.qkv = fuse([w.linear(f"{p}self_attn.{x}_proj.weight", (n, hidden)) for x, n in parts])
        self.o_proj = w.linear(p + "self_attn.o_proj.weight", (hidden, self.q_size))
        d, f32 = self.head_dim, mx.float32
        self.q_norm = w.take(p + "self_attn.q_norm.weight", (d,), f32)
        self.k_norm = None if self.shared else w.take(p + "self_attn.k_norm.weight", (d,), f32)

    def _feedforward_weights(
        self, c: ModelConfig, g: Gemma4Extras, p: str, w: WeightReader
    ) -> None:
        """The dense MLP, the experts beside it and the per-layer input's gate."""
        hidden, width = c.hidden_size, self.width
        gate_up = [w.linear(f"{p}mlp.{x}_proj.weight", (width, hidden)) for x in ("gate", "up")]
        self.gate_up = fuse(gate_up)
        self.down_proj = w.linear(p + "mlp.down_proj.weight", (hidden, width))
        self.moe = Gemma4Experts(c, p, w, self.gelu) if c.num_experts else None
        self.per_layer_gate: Linear | None = None
        self.per_layer_proj: Linear | None = None
        if g.per_layer_size:
            size = g.per_layer_size
            self.per_layer_gate = w.linear(p + "per_layer_input_gate.weight", (size, hidden))
            self.per_layer_proj = w.linear(p + "per_layer_projection.weight", (hidden, size))

    def arrays(self) -> list[mx.array]:
        return arrays_of(vars(self).values())

    def attention(
        self, h: mx.array, cos: mx.array, sin: mx.array, attn: MLXPagedAttention, kv: KV
    ) -> mx.array:
        """Normed hidden states [T, hidden] -> attention output before o_proj [T, Hq * D]."""
        tokens, d, eps = h.shape[0], self.head_dim, self.eps
        qkv = self.qkv(h)
        q = qkv[:, : self.q_size].reshape(tokens, -1, d)
        q = apply_rotary(norm(q, self.q_norm, eps), cos, sin)
        if self.shared:  # the source layer's K/V of this step, already stored
            k, v = kv[self.kv_id]
            return attn.forward(q, k, v, self.kv_id, 1.0, store=False)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(tokens, -1, d)
        v = k if self.k_eq_v else qkv[:, self.q_size + self.kv_size :].reshape(tokens, -1, d)
        v = norm(v, None, eps)  # (before k's norm and RoPE: keys as values are raw keys)
        k = apply_rotary(norm(k, self.k_norm, eps), cos, sin)
        kv[self.kv_id] = k, v
        return attn.forward(q, k, v, self.kv_id, 1.0)

    def mlp(self, h: mx.array) -> mx.array:
        gate_up = self.gate_up(h)
        gate, up = gate_up[:, : self.width], gate_up[:, self.width :]
        return self.down_proj(self.gelu(gate) * up)

    def __call__(
        self,
        x: mx.array,  # [T, hidden]
        per_layer: mx.array | None,  # [T, per_layer_size]: this layer's input, if any
        rope: tuple[mx.array, mx.array],
        attn: MLXPagedAttention,
        kv: KV,
    ) -> mx.array:
        n, eps = self.norms, self.eps
        h = self.attention(norm(x, n["input_layernorm"], eps), *rope, attn, kv)
        x = x + norm(self.o_proj(h), n["post_attention_layernorm"], eps)
        h = self.mlp(norm(x, n["pre_feedforward_layernorm"], eps))
        if self.moe is not None:  # experts beside the dense MLP, fed (and routed by) x
            h = norm(h, n["post_feedforward_layernorm_1"], eps)
            e = self.moe(norm(x, n["pre_feedforward_layernorm_2"], eps), x)
            h = h + norm(e, n["post_feedforward_layernorm_2"], eps)
        x = x + norm(h, n["post_feedforward_layernorm"], eps)
        if per_layer is not None:
            assert self.per_layer_gate is not None and self.per_layer_proj is not None
            h = self.per_layer_proj(self.gelu(self.per_layer_gate(x)) * per_layer)
            x = x + norm(h, n["post_per_layer_input_norm"], eps)
        return x if self.scalar is None else x * self.scalar


class MLXGemma4ForCausalLM(MLXDecoderForCausalLM):
    """forward(input_ids [T], positions [T], attn) -> hidden [T, H]; compute_logits -> fp32."""

    def __init__(
        self, config: ModelConfig, weights: dict[str, mx.array | Quantized], dtype: mx.Dtype
    ) -> None:
        c, g = config, config.gemma4
        if g is None:
            raise ValueError(f"{c.architecture}: not a Gemma 4 config")
        if c.hidden_act not in _GELU:
            raise ValueError(f"Gemma 4 with hidden_activation {c.hidden_act!r} is not supported")
        self.config, self.extras, self.dtype = c, g, dtype
        w = WeightReader(_text_weights(weights), dtype)
        vocab, hidden, gelu = c.vocab_size, c.hidden_size, _GELU[c.hidden_act]
        self.embed_tokens = w.linear("model.embed_tokens.weight", (vocab, hidden))
        self.embed_scale = mx.array(c.embed_scale, dtype=dtype)  # rounded, as transformers
        self.blocks = [Gemma4Layer(c, g, i, w, gelu) for i in range(c.num_hidden_layers)]
        self.norm = w.take("model.norm.weight", (hidden,), mx.float32)
        self.lm_head = (
            None if c.tie_word_embeddings else w.linear("lm_head.weight", (vocab, hidden))
        )
        self.local = Gemma4Rotary(g.local_rope, c.head_dim, dtype)
        self.full = Gemma4Rotary(g.global_rope, g.global_head_dim, dtype)
        # per-layer inputs: a token table, a projection of the embeddings and its norm
        self.per_layer_table: Dense | Quantized | None = None
        self.per_layer_projection: Linear | None = None
        self.per_layer_norm: mx.array | None = None
        if g.per_layer_size:
            size = c.num_hidden_layers * g.per_layer_size
            name = "model.embed_tokens_per_layer.weight"
            self.per_layer_table = w.linear(name, (g.per_layer_vocab, size))
            name = "model.per_layer_model_projection.weight"
            self.per_layer_projection = w.linear(name, (size, hidden))
            name = "model.per_layer_projection_norm.weight"
            self.per_layer_norm = w.take(name, (g.per_layer_size,), mx.float32)
        w.check_all_used()
        mx.eval(self.parameters())

    def parameters(self) -> list[mx.array]:
        top = [self.norm, self.embed_tokens, self.lm_head, self.per_layer_table]
        return arrays_of([*top, self.per_layer_projection, self.per_layer_norm, *self.blocks])

    def forward(
        self, input_ids: mx.array, positions: mx.array, attn: MLXPagedAttention
    ) -> mx.array:
        x = self.embed_tokens.rows(input_ids) * self.embed_scale
        per_layer = self._per_layer_inputs(input_ids, x)
        local, full = self.local.lookup(positions), self.full.lookup(positions)
        kv: KV = {}
        for i, block in enumerate(self.blocks):
            inputs = None if per_layer is None else per_layer[:, i]
            x = block(x, inputs, local if block.sliding else full, attn, kv)
        return norm(x, self.norm, self.config.rms_norm_eps)

    def _per_layer_inputs(self, ids: mx.array, x: mx.array) -> mx.array | None:
        """[T, layers, per_layer_size]: each layer's input from the tokens and embeddings."""
        table, projection = self.per_layer_table, self.per_layer_projection
        weight = self.per_layer_norm
        if table is None or projection is None or weight is None:
            return None
        size, tokens = self.extras.per_layer_size, ids.shape[0]
        scale = mx.array(size**0.5, dtype=self.dtype)  # rounded, as transformers
        token = (table.rows(ids) * scale).reshape(tokens, -1, size)
        proj = projection(x) * self.config.hidden_size**-0.5
        proj = norm(proj.reshape(tokens, -1, size), weight, self.config.rms_norm_eps)
        return (proj + token) * 2.0**-0.5

    def compute_logits(self, hidden: mx.array) -> mx.array:
        """hidden [N, H] -> float32 logits [N, vocab], soft-capped when configured."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        logits = head(hidden).astype(mx.float32)
        cap = self.config.final_logit_softcap
        return mx.tanh(logits / cap) * cap if cap else logits


def _norms(c: ModelConfig, g: Gemma4Extras) -> list[str]:
    """A layer's RMSNorms over the hidden size."""
    names = ["input_layernorm", "post_attention_layernorm"]
    names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    names += ["post_per_layer_input_norm"] if g.per_layer_size else []
    if c.num_experts:
        names += ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2"]
        names.append("pre_feedforward_layernorm_2")
    return names


def _text_weights(weights: dict[str, mx.array | Quantized]) -> dict[str, mx.array | Quantized]:
    """A multimodal checkpoint's text weights under the text model's names, towers dropped."""
    out = {}
    for name, array in weights.items():
        name = name.replace("model.language_model.", "model.", 1)
        if not _IGNORED.fullmatch(name):
            out[name] = array
    return out
