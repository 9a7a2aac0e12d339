"""gpt-oss on MLX (twin of models/gpt_oss.py): the decoder's blocks (model.py) with
gpt-oss's differences:

- attention: q/k/v and output projections with biases, and attention sinks (a learned logit
  per query head that joins the softmax's denominator only), which the paged attention hands
  to `mx.fast.scaled_dot_product_attention` (and its cascade path merges like a key);
- alternating sliding-window and full-attention layers (the paged attention applies
  `ModelConfig.layer_windows()`), all rotated with one YaRN RoPE (rope.py);
- a mixture of experts on every layer (moe.py's gathered experts): a router linear with a bias,
  softmax over the top-k logits (not the top-k of a softmax), experts with biases and a clamped
  SwiGLU, `(up + 1) * gate * sigmoid(alpha * gate)`;
- RMSNorms in float32, cast back after the weight.

Checkpoints stack each layer's experts transposed, `gate_up_proj` [E, H, 2I] with gate and up
interleaved column by column and `down_proj` [E, I, H]: kept as they are (the activation reads
gate and up at even and odd columns). OpenAI's release stores them MXFP4 (`*_blocks` uint8
[E, out, in / 32, 16], two e2m1 codes a byte, low nibble first; `*_scales` uint8 [E, out,
in / 32] biased exponents), which is MLX's own "mxfp4" layout byte for byte: the blocks are
viewed as its packed uint32 and multiplied quantized (`mx.gather_qmm`), never dequantized.
"""

from __future__ import annotations

import mlx.core as mx

from localradix.backends.mlx.model import DecoderLayer, MLXDecoderForCausalLM, float32_norm
from localradix.backends.mlx.moe import MoEBlock, StackedExperts
from localradix.backends.mlx.quant import QuantSpec
from localradix.backends.mlx.reader import WeightReader
from localradix.models.config import ModelConfig

MXFP4 = QuantSpec(32, 4, "mxfp4")


def expert_matrices(w: WeightReader, name: str, experts: int, out: int, inp: int):
    """Experts' [E, out, in] matrices from a float [E, in, out] tensor, or MXFP4 blocks."""
    if name + "_blocks" not in w:
        return StackedExperts.dense(w.take(name, (experts, inp, out)).swapaxes(1, 2))
    groups = inp // 32
    blocks = w.raw(name + "_blocks", (experts, out, groups, 16))
    scales = w.raw(name + "_scales", (experts, out, groups))
    packed = blocks.reshape(experts, out, groups * 16).view(mx.uint32)  # 8 codes a uint32
    return StackedExperts(packed, scales, None, MXFP4)


class GptOssExperts(MoEBlock):
    """The MoE block with biases everywhere, gpt-oss's routing and its clamped SwiGLU."""

    def __init__(self, c: ModelConfig, prefix: str, w: WeightReader) -> None:  # own names
        hidden, inter, experts = c.hidden_size, c.moe_intermediate_size, c.num_experts
        self.top_k, self.intermediate = c.num_experts_per_tok, inter
        self.limit, self.alpha = c.swiglu_limit, c.swiglu_alpha
        self.router = w.linear(prefix + "router.weight", (experts, hidden))
        self.router_bias = w.take(prefix + "router.bias", (experts,))
        p = prefix + "experts."
        self.gate_up = expert_matrices(w, p + "gate_up_proj", experts, 2 * inter, hidden)
        self.gate_up_bias = w.take(p + "gate_up_proj_bias", (experts, 2 * inter))
        self.down = expert_matrices(w, p + "down_proj", experts, hidden, inter)
        self.down_bias = w.take(p + "down_proj_bias", (experts, hidden))

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """Softmax over the top-k router logits, in the activation dtype, as transformers."""
        logits = self.router(x) + self.router_bias
        ids = mx.argpartition(-logits, kth=self.top_k - 1, axis=-1)[:, : self.top_k]
        top = mx.take_along_axis(logits, ids, axis=-1).astype(mx.float32)
        return mx.softmax(top, axis=-1).astype(x.dtype), ids

    def activate(self, h: mx.array) -> mx.array:
        gate, up = h[..., 0::2], h[..., 1::2]  # (interleaved, as the checkpoint stores them)
        gate = mx.minimum(gate, self.limit)
        up = mx.clip(up, -self.limit, self.limit)
        return (up + 1) * (gate * mx.sigmoid(gate * self.alpha))


class GptOssLayer(DecoderLayer):
    moe_class = GptOssExperts
    norm = staticmethod(float32_norm)

    def __init__(self, c: ModelConfig, layer_id: int, w: WeightReader) -> None:
        super().__init__(c, layer_id, w)
        p = f"model.layers.{layer_id}.self_attn."
        self.input_norm = self.input_norm.astype(mx.float32)
        self.post_norm = self.post_norm.astype(mx.float32)
        self.o_bias = w.take(p + "o_proj.bias", (c.hidden_size,))
        # [Hq] logits, in the model dtype as transformers keeps them (SDPA wants q's dtype)
        self.sinks = w.take(p + "sinks", (c.num_attention_heads,))

    def output(self, o: mx.array) -> mx.array:
        return self.o_proj(o) + self.o_bias


class MLXGptOssForCausalLM(MLXDecoderForCausalLM):
    layer_class = GptOssLayer
    final_norm = staticmethod(float32_norm)

    def setup(self, w: WeightReader) -> None:
        self.norm = self.norm.astype(mx.float32)
