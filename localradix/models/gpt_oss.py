"""gpt-oss (transformers' `GptOssForCausalLM`, `model_type` "gpt_oss").

The Llama-style decoder (`decoder.py`: fused qkv weights, the same weight names and loader)
with gpt-oss's differences:

- attention: q/k/v and output projections with biases, and attention sinks: a learned logit per
  query head that joins the softmax's denominator only, handed to the attention backend with
  each call (`AttentionBackend.forward`'s `sinks`; backends without them refuse the model);
- alternating sliding-window and full-attention layers (the backend applies
  `ModelConfig.layer_windows()`), all rotated with one YaRN RoPE (`rotary.py`);
- a mixture of experts on every layer (`moe.py`'s block, static shapes, no host sync): a router
  linear with a bias, softmax over the top-k logits (not the top-k of a softmax), experts with
  biases and a clamped SwiGLU, `(up + 1) * gate * sigmoid(alpha * gate)`;
- RMSNorms in float32 (transformers keeps their weights in float32), cast back after the weight.

Checkpoints stack each layer's experts transposed: `gate_up_proj` [E, H, 2I] with gate and up
interleaved column by column, `down_proj` [E, I, H]; `load_weights` turns them into the MoE
block's [E, 2I, H] (gate rows, then up rows) and [E, H, I] on the way in. OpenAI's own release
stores the experts MXFP4-quantised (`*_blocks` / `*_scales`): they are dequantised at load to
the model's dtype, as transformers does without its MXFP4 kernels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F

from localradix.model_api.attention import AttentionBackend
from localradix.model_api.tp_comm import SINGLE, TPComm
from localradix.models.config import ModelConfig
from localradix.models.decoder import DecoderForCausalLM, DecoderLayer, _Factory
from localradix.models.moe import MoEBlock


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """gpt-oss's RMSNorm: in float32, times the float32 weight, then cast back."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight, eps).to(x.dtype)


class GptOssExperts(MoEBlock):
    """The MoE block with biases everywhere, gpt-oss's routing and its clamped SwiGLU."""

    def __init__(self, config: ModelConfig, new: _Factory) -> None:
        super().__init__(config, new, biases=True)
        self.limit, self.alpha = config.swiglu_limit, config.swiglu_alpha

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax over the top-k router logits, in the activation dtype, as transformers."""
        top, ids = torch.topk(F.linear(x, self.router_weight, self.router_bias), self.top_k)
        return F.softmax(top, dim=-1), ids

    def activate(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(-self.limit, self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


class GptOssLayer(DecoderLayer):
    moe_class = GptOssExperts

    def __init__(
        self, config: ModelConfig, layer_id: int, new: _Factory, tp: TPComm = SINGLE
    ) -> None:
        super().__init__(config, layer_id, new, tp)
        c = config
        self.o_bias = new(c.hidden_size) if c.attention_bias else None
        self.sinks = new(c.num_attention_heads)  # [Hq] logits, for the attention backend
        self.norm_weights: list[torch.Tensor] = []  # float32 input and post-attention norms

    def finalize(self) -> None:
        super().finalize()
        self.norm_weights = [w.detach().float() for w in (self.input_norm, self.post_norm)]

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]: previous layer's output (or the embeddings)
        residual: torch.Tensor | None,  # [T, hidden]: running residual stream
        cos: torch.Tensor,  # [T, 1, head_dim]
        sin: torch.Tensor,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = x if residual is None else x + residual
        in_norm, post_norm = self.norm_weights
        qkv = F.linear(_norm(residual, in_norm, self.eps), self.qkv_weight, self.qkv_bias)
        tokens = qkv.shape[0]
        qk = qkv[:, : self.qk_size].view(tokens, self.num_qk_heads, self.head_dim)
        assert self.rotate is not None and self.moe is not None
        v = qkv[:, self.qk_size :].view(tokens, -1, self.head_dim)
        # RoPE and the K/V store: one call (one kernel with the Triton backend)
        q, k = attn.rope_store(qk, v, self.layer_id, cos, sin, None, self.eps)
        o = attn.forward(q, k, v, self.layer_id, self.scale, self.sinks, stored=True)
        residual = F.linear(o, self.o_weight, self.o_bias) + residual
        return self.moe.forward(_norm(residual, post_norm, self.eps)), residual


class GptOssForCausalLM(DecoderForCausalLM):
    """forward(input_ids [T], positions [T], attn) -> hidden [T, H]; compute_logits -> fp32."""

    layer_class = GptOssLayer

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
        tp: TPComm = SINGLE,
    ) -> None:
        if tp.size > 1:  # (Shard.check refuses it first: its sinks and biases are not split)
            raise ValueError(f"--tp {tp.size} does not split gpt-oss: serve it with --tp 1")
        super().__init__(config, dtype, device, max_positions, tp)
        self.norm_weight = self.norm.detach().float()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self._embed(input_ids)
        cos, sin = self.rotary.lookup(positions)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            x, residual = layer.forward(x, residual, cos, sin, attn)
        assert residual is not None  # a model has at least one layer
        return _norm(x + residual, self.norm_weight, self.eps)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_our_layouts(weights))
        self.norm_weight = self.norm.detach().float()


def _our_layouts(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """gpt-oss's router and expert tensors under the MoE block's names and layouts (MXFP4
    experts dequantised once both halves of a pair have come)."""
    pending: dict[str, torch.Tensor] = {}  # MXFP4 blocks or scales waiting for their pair
    for name, tensor in weights:
        if name.endswith(("_blocks", "_scales")):
            pending[name] = tensor
            stem = name.rsplit("_", 1)[0]
            if f"{stem}_blocks" not in pending or f"{stem}_scales" not in pending:
                continue
            blocks, scales = pending.pop(f"{stem}_blocks"), pending.pop(f"{stem}_scales")
            name, tensor = stem, dequantize_mxfp4(blocks, scales).transpose(1, 2)
        if ".mlp.router." in name:
            name = name.replace(".mlp.router.", ".mlp.gate.")
        elif name.endswith("mlp.experts.gate_up_proj"):  # [E, H, 2I], gate/up interleaved
            tensor = _deinterleave(tensor.transpose(1, 2))  # [E, 2I, H]
        elif name.endswith("mlp.experts.gate_up_proj_bias"):  # [E, 2I], interleaved
            tensor = _deinterleave(tensor)
        elif name.endswith("mlp.experts.down_proj"):  # [E, I, H]
            tensor = tensor.transpose(1, 2)
        yield name, tensor
    if pending:
        raise ValueError(f"MXFP4 blocks or scales without their pair: {', '.join(pending)}")


# The 16 values of a 4-bit e2m1 float (sign, 2 exponent bits, 1 mantissa bit), by code
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_VALUES = _E2M1 + tuple(-v for v in _E2M1)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4: uint8 blocks [E, rows, G, 16] (two e2m1 codes a byte, low nibble first) and uint8
    scales [E, rows, G] (each 32-value group's power of two, biased by 127) -> bfloat16
    [E, rows, G * 32], exactly (every value fits bfloat16), as transformers' dequantisation
    before its transpose. One expert at a time, to bound the temporaries."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.bfloat16, device=blocks.device)
    out = torch.empty(*blocks.shape[:-1], 32, dtype=torch.bfloat16, device=blocks.device)
    for expert, (codes, scale) in enumerate(zip(blocks, scales, strict=True)):
        values = out[expert]
        values[..., 0::2] = lut[(codes & 0x0F).long()]
        values[..., 1::2] = lut[(codes >> 4).long()]
        torch.ldexp(values, scale.int()[..., None] - 127, out=values)
    return out.flatten(-2)


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] with gate and up rows alternating -> all gates, then all ups."""
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)
