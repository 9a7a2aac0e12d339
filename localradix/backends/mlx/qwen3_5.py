"""Qwen3.5, Qwen3.5-MoE and Qwen3-Next on MLX (twin of models/qwen3_5.py): gated delta-net
linear attention (delta_net.py) beside gated full attention, per `layer_types`.

Each layer: input norm -> token mixer -> residual -> post norm -> MLP -> residual, every norm
(1 + w) in float32 except the delta-net's gated one. Full attention: q_proj gives each head its
query and a gate (interleaved per head in the checkpoint, regrouped at load), q/k per-head
RMSNorm, RoPE on the leading `rotary_dim` dims, and the output times sigmoid(gate) before
o_proj. The MLP is a SwiGLU, or the experts (moe.py, Qwen3-MoE routing) plus a shared SwiGLU
expert scaled by sigmoid(shared_expert_gate(x)). Only full-attention layers keep KV (numbered
0..n-1 for the paged attention); the delta-nets' state is the runner's `MLXRecurrentStates`.
A multimodal checkpoint's `model.language_model.` weights are its text model's; its vision
tower and multi-token-prediction head are skipped.
"""

from __future__ import annotations

import mlx.core as mx

from localradix.backends.mlx.attention import MLXPagedAttention
from localradix.backends.mlx.delta_net import GatedDeltaNet, permute_rows, silu
from localradix.backends.mlx.gemma3 import _plus_one
from localradix.backends.mlx.model import MLXDecoderForCausalLM, float32_norm, fused_linear
from localradix.backends.mlx.moe import MoEBlock
from localradix.backends.mlx.quant import Linear, Quantized, fuse
from localradix.backends.mlx.reader import WeightReader
from localradix.backends.mlx.recurrent_state import MLXRecurrentStates
from localradix.backends.mlx.rope import Rotary, apply_rotary
from localradix.models.config import ModelConfig

_SKIPPED = ("model.mtp.", "mtp.", "model.visual.")


class GatedAttention:
    """Qwen3.5's `self_attn`: x [T, hidden] -> [T, hidden] (no residual)."""

    def __init__(self, c: ModelConfig, kv_layer: int, prefix: str, w: WeightReader) -> None:
        self.kv_layer, self.eps, self.head_dim = kv_layer, c.rms_norm_eps, c.head_dim
        self.q_size, self.kv_size = c.q_size, c.kv_size
        self.scale = c.head_dim**-0.5
        hidden, d, heads = c.hidden_size, c.head_dim, c.num_attention_heads
        # q_proj's rows hold per head its query, then its gate: split into queries and gates
        query, gate = (
            [h * 2 * d + part * d + i for h in range(heads) for i in range(d)] for part in (0, 1)
        )
        q_proj = w.linear(prefix + "q_proj.weight", (2 * c.q_size, hidden))
        k, v = (w.linear(f"{prefix}{x}_proj.weight", (c.kv_size, hidden)) for x in "kv")
        # one matmul for the rows of queries, keys, values, gates
        self.qkvg = fuse([permute_rows(q_proj, query), k, v, permute_rows(q_proj, gate)])
        self.qkvg_bias = self.o_bias = None
        if c.attention_bias:
            qb = w.take(prefix + "q_proj.bias", (2 * c.q_size,))
            kb, vb = (w.take(f"{prefix}{x}_proj.bias", (c.kv_size,)) for x in "kv")
            parts = [qb[mx.array(query)], kb, vb, qb[mx.array(gate)]]
            self.qkvg_bias = mx.concatenate(parts)
            self.o_bias = w.take(prefix + "o_proj.bias", (hidden,))
        self.q_norm = _plus_one(w.take(prefix + "q_norm.weight", (d,)))
        self.k_norm = _plus_one(w.take(prefix + "k_norm.weight", (d,)))
        self.o_proj = w.linear(prefix + "o_proj.weight", (hidden, c.q_size))

    def arrays(self) -> list[mx.array]:
        out = self.qkvg.arrays() + self.o_proj.arrays() + [self.q_norm, self.k_norm]
        return out + [a for a in (self.qkvg_bias, self.o_bias) if a is not None]

    def __call__(
        self, x: mx.array, cos: mx.array, sin: mx.array, attn: MLXPagedAttention
    ) -> mx.array:
        qkvg = self.qkvg(x)
        if self.qkvg_bias is not None:
            qkvg = qkvg + self.qkvg_bias
        tokens, d = qkvg.shape[0], self.head_dim
        q_end, k_end = self.q_size, self.q_size + self.kv_size
        q = float32_norm(qkvg[:, :q_end].reshape(tokens, -1, d), self.q_norm, self.eps)
        k = float32_norm(qkvg[:, q_end:k_end].reshape(tokens, -1, d), self.k_norm, self.eps)
        v = qkvg[:, k_end : k_end + self.kv_size].reshape(tokens, -1, d)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = attn.forward(q, k, v, self.kv_layer, self.scale)
        out = self.o_proj(o * mx.sigmoid(qkvg[:, k_end + self.kv_size :]))
        return out if self.o_bias is None else out + self.o_bias


class Qwen3_5Layer:
    def __init__(self, c: ModelConfig, layer_id: int, w: WeightReader) -> None:
        p, hidden = f"model.layers.{layer_id}.", c.hidden_size
        self.eps = c.rms_norm_eps
        linear_before = sum(c.linear_layers[:layer_id]) if c.linear_layers else 0
        self.mixer: GatedDeltaNet | GatedAttention
        if c.linear_layers and c.linear_layers[layer_id]:
            self.mixer = GatedDeltaNet(c, linear_before, p + "linear_attn.", w)
        else:
            self.mixer = GatedAttention(c, layer_id - linear_before, p + "self_attn.", w)
        self.input_norm = _plus_one(w.take(p + "input_layernorm.weight", (hidden,)))
        self.post_norm = _plus_one(w.take(p + "post_attention_layernorm.weight", (hidden,)))
        self.moe = MoEBlock(c, p + "mlp.", w) if c.uses_moe(layer_id) else None
        # the dense MLP, or (the MoE models) the shared expert beside the experts, and its gate
        size = c.shared_expert_size if self.moe is not None else c.intermediate_size
        mlp = p + ("mlp.shared_expert." if self.moe is not None else "mlp.")
        self.size = size
        self.gate_up: Linear | None = None
        self.down: Linear | None = None
        self.shared_gate: Linear | None = None
        if size:
            parts = [(f"{mlp}{x}_proj.weight", size) for x in ("gate", "up")]
            self.gate_up = fused_linear(w, None, parts, hidden)
            self.down = w.linear(mlp + "down_proj.weight", (hidden, size))
            if self.moe is not None:
                self.shared_gate = w.linear(p + "mlp.shared_expert_gate.weight", (1, hidden))

    def arrays(self) -> list[mx.array]:
        out = self.mixer.arrays() + [self.input_norm, self.post_norm]
        out += [] if self.moe is None else self.moe.arrays()
        for layer in (self.gate_up, self.down, self.shared_gate):
            out += [] if layer is None else layer.arrays()
        return out

    def __call__(
        self,
        x: mx.array,
        cos: mx.array,
        sin: mx.array,
        attn: MLXPagedAttention,
        states: MLXRecurrentStates | None,
    ) -> mx.array:
        h = float32_norm(x, self.input_norm, self.eps)
        if isinstance(self.mixer, GatedDeltaNet):
            if states is None:
                raise ValueError("Qwen3.5's linear-attention layers need the runner's states")
            x = x + self.mixer(h, states)
        else:
            x = x + self.mixer(h, cos, sin, attn)
        h = float32_norm(x, self.post_norm, self.eps)
        return x + self.mlp(h)

    def mlp(self, h: mx.array) -> mx.array:
        out = None if self.moe is None else self.moe(h)
        if self.gate_up is None or self.down is None:
            assert out is not None
            return out
        gate_up = self.gate_up(h)
        dense = self.down(silu(gate_up[:, : self.size]) * gate_up[:, self.size :])
        if out is None or self.shared_gate is None:
            return dense
        return out + mx.sigmoid(self.shared_gate(h)) * dense


class MLXQwen3_5ForCausalLM(MLXDecoderForCausalLM):
    """forward(input_ids [T], positions [T], attn, states) -> hidden [T, H]."""

    def __init__(
        self, config: ModelConfig, weights: dict[str, mx.array | Quantized], dtype: mx.Dtype
    ) -> None:
        # Not the decoder's __init__, which builds Llama-style layers: these are built here.
        self.config, self.dtype = config, dtype
        w = WeightReader(_text_weights(weights), dtype)
        vocab, hidden = config.vocab_size, config.hidden_size
        self.embed_tokens = w.linear("model.embed_tokens.weight", (vocab, hidden))
        self.layers = []  # (the decoder's; this model's are `blocks`)
        self.blocks = [Qwen3_5Layer(config, i, w) for i in range(config.num_hidden_layers)]
        self.norm = _plus_one(w.take("model.norm.weight", (hidden,)))
        self.lm_head = (
            None if config.tie_word_embeddings else w.linear("lm_head.weight", (vocab, hidden))
        )
        self.rotary = Rotary(config, dtype)
        w.check_all_used()
        mx.eval(self.parameters())

    def parameters(self) -> list[mx.array]:
        return super().parameters() + [a for block in self.blocks for a in block.arrays()]

    def forward(
        self,
        input_ids: mx.array,
        positions: mx.array,
        attn: MLXPagedAttention,
        states: MLXRecurrentStates | None = None,
    ) -> mx.array:
        x = self.embed_tokens.rows(input_ids)
        cos, sin = self.rotary.lookup(positions)
        for block in self.blocks:
            x = block(x, cos, sin, attn, states)
        return float32_norm(x, self.norm, self.config.rms_norm_eps)


def _text_weights(weights: dict[str, mx.array | Quantized]) -> dict[str, mx.array | Quantized]:
    """The text model's weights under the text model's names."""
    out = {}
    for name, array in weights.items():
        if name.startswith(_SKIPPED) or name.endswith("rotary_emb.inv_freq"):
            continue
        out[name.replace("model.language_model.", "model.", 1)] = array
    return out
