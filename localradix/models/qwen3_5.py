"""Qwen3.5 text models (transformers' `Qwen3_5ForCausalLM`, "qwen3_5_text"), Qwen3.5-MoE
(`Qwen3_5MoeForCausalLM`, "qwen3_5_moe_text") and Qwen3-Next (`Qwen3NextForCausalLM`,
"qwen3_next"): gated delta-net linear attention (`delta_net.py`) beside full attention, per
`layer_types`.

Each layer is input norm -> token mixer -> residual -> post norm -> MLP -> residual, every
RMSNorm zero-centred ((1 + w), in float32: Gemma's convention) except the delta-net's gated
output norm. The full-attention layers differ from Qwen3's by an output gate: q_proj gives each
head its query and a gate, and attention's output is multiplied by sigmoid(gate) before o_proj;
q/k are RMS-normed per head and RoPE turns the leading quarter of each head
(`partial_rotary_factor`). Text-only positions make transformers' multimodal RoPE sections
plain RoPE. The MLP is a SwiGLU, or (the MoE models) experts (`moe.py`, Qwen3-MoE routing)
plus a shared SwiGLU expert scaled by sigmoid(shared_expert_gate(x)); Qwen3-Next keeps dense
MLPs where Qwen3-MoE's rule says so, and groups its delta-nets' fused projections per key head
(regrouped at load). Only the full-attention layers keep KV: the attention backend numbers
them 0..n-1 (`ModelConfig.kv_layers`); the delta-nets' state lives in the runner's
`RecurrentStates`, passed to `forward` as `attn` is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from localradix.model_api.attention import AttentionBackend
from localradix.model_api.recurrent_state import RecurrentStates
from localradix.model_api.tp_comm import SINGLE, TPComm
from localradix.models.config import ModelConfig
from localradix.models.decoder import _Factory
from localradix.models.delta_net import GatedDeltaNet
from localradix.models.gemma3 import _plus_one, gemma_norm
from localradix.models.moe import MoEBlock
from localradix.models.rotary import RotaryTable, apply_partial_rotary, apply_rotary

_IGNORED = re.compile(r"(mtp\.|model\.visual\.).*|.*rotary_emb\.inv_freq")


class GatedAttention(nn.Module):
    """Qwen3.5's `self_attn`: x [T, hidden] -> [T, hidden] (no residual)."""

    def __init__(self, config: ModelConfig, kv_layer: int, new: _Factory) -> None:
        super().__init__()
        c = config
        self.kv_layer, self.eps = kv_layer, c.rms_norm_eps
        self.head_dim, self.num_heads = c.head_dim, c.num_attention_heads
        self.num_qk_heads = c.num_attention_heads + c.num_key_value_heads
        self.qk_size, self.kv_size, self.q_size = c.q_size + c.kv_size, c.kv_size, c.q_size
        self.scale = c.head_dim**-0.5
        self.rotate = apply_rotary if c.rotary_dim == c.head_dim else apply_partial_rotary
        # rows: queries, keys, values, then the gates (q_proj interleaves query and gate heads)
        self.qkvg_weight = new(2 * c.q_size + 2 * c.kv_size, c.hidden_size)
        self.qkvg_bias = new(2 * c.q_size + 2 * c.kv_size) if c.attention_bias else None
        self.q_norm, self.k_norm = new(c.head_dim), new(c.head_dim)
        self.o_weight = new(c.hidden_size, c.q_size)
        self.o_bias = new(c.hidden_size) if c.attention_bias else None
        self.qk_norm_weight: torch.Tensor | None = None  # [Hq + Hkv, D] float32 1 + w

    def finalize(self) -> None:
        q = _plus_one(self.q_norm).expand(self.num_heads, -1)
        k = _plus_one(self.k_norm).expand(self.num_qk_heads - self.num_heads, -1)
        self.qk_norm_weight = torch.cat([q, k]).contiguous()

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        assert self.qk_norm_weight is not None
        qkvg = F.linear(x, self.qkvg_weight, self.qkvg_bias)
        tokens = qkvg.shape[0]
        qk = qkvg[:, : self.qk_size].view(tokens, self.num_qk_heads, self.head_dim)
        qk = self.rotate(gemma_norm(qk, self.qk_norm_weight, self.eps), cos, sin)
        v = qkvg[:, self.qk_size : self.qk_size + self.kv_size].view(tokens, -1, self.head_dim)
        gate = qkvg[:, self.qk_size + self.kv_size :]
        o = attn.forward(
            qk[:, : self.num_heads], qk[:, self.num_heads :], v, self.kv_layer, self.scale
        )
        return F.linear(o * gate.sigmoid(), self.o_weight, self.o_bias)


class Qwen3_5Layer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, new: _Factory) -> None:
        super().__init__()
        c = config
        self.eps, self.hidden_shape = c.rms_norm_eps, (c.hidden_size,)
        before = c.linear_layers[:layer_id] if c.linear_layers else ()
        linear_before = sum(before)
        self.linear_attn: GatedDeltaNet | None = None
        self.self_attn: GatedAttention | None = None
        if c.linear_layers and c.linear_layers[layer_id]:
            self.linear_attn = GatedDeltaNet(c, linear_before, new)
        else:
            self.self_attn = GatedAttention(c, layer_id - linear_before, new)
        self.input_norm = new(c.hidden_size)
        self.post_norm = new(c.hidden_size)
        self.moe = MoEBlock(c, new) if c.uses_moe(layer_id) else None
        # the dense MLP, or (Qwen3.5-MoE) the shared expert beside the experts, with its gate
        size = c.shared_expert_size if self.moe is not None else c.intermediate_size
        self.gate_up_weight = new(2 * size, c.hidden_size) if size else None
        self.down_weight = new(c.hidden_size, size) if size else None
        self.shared_gate = new(1, c.hidden_size) if self.moe is not None and size else None
        self.norm_weights: tuple[torch.Tensor, torch.Tensor] | None = None  # float32 1 + w

    def finalize(self) -> None:
        self.norm_weights = (_plus_one(self.input_norm), _plus_one(self.post_norm))
        mixer = self.linear_attn or self.self_attn
        assert mixer is not None
        mixer.finalize()

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionBackend,
        states: RecurrentStates | None,
    ) -> torch.Tensor:
        assert self.norm_weights is not None
        in_norm, post_norm = self.norm_weights
        h = gemma_norm(x, in_norm, self.eps)
        if self.linear_attn is not None:
            if states is None:
                raise ValueError("Qwen3.5's linear-attention layers need the runner's states")
            x = x + self.linear_attn.forward(h, states)
        else:
            assert self.self_attn is not None
            x = x + self.self_attn.forward(h, cos, sin, attn)
        h = gemma_norm(x, post_norm, self.eps)
        out = None if self.moe is None else self.moe.forward(h)
        if self.gate_up_weight is None or self.down_weight is None:
            assert out is not None
            return x + out
        gate, up = F.linear(h, self.gate_up_weight).chunk(2, dim=-1)
        mlp = F.linear(F.silu(gate) * up, self.down_weight)
        if out is None:
            return x + mlp
        assert self.shared_gate is not None
        return x + (out + F.linear(h, self.shared_gate).sigmoid() * mlp)


class Qwen3_5ForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T], attn, states) -> hidden [T, H]; compute_logits
    -> float32 logits."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
        tp: TPComm = SINGLE,
    ) -> None:
        super().__init__()
        if tp.size > 1:
            raise ValueError(f"--tp {tp.size} does not split {config.architecture}")
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        self.max_positions, self.eps = max_positions, config.rms_norm_eps
        new = _Factory(dtype, self.device)
        self.embed_tokens = new(config.vocab_size, config.hidden_size)
        self.blocks = [Qwen3_5Layer(config, i, new) for i in range(config.num_hidden_layers)]
        self.layers = nn.ModuleList(self.blocks)
        self.norm = new(config.hidden_size)
        self.lm_head = None if config.tie_word_embeddings else new(*self.embed_tokens.shape)
        self.rotary = RotaryTable(config, dtype, self.device, max_positions)
        self.final_norm: torch.Tensor | None = None  # float32 1 + w

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        states: RecurrentStates | None = None,
    ) -> torch.Tensor:
        assert self.final_norm is not None, "load_weights first"
        x = F.embedding(input_ids, self.embed_tokens)
        cos, sin = self.rotary.lookup(positions)
        for layer in self.blocks:
            x = layer.forward(x, cos, sin, attn, states)
        return gemma_norm(x, self.final_norm, self.eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (usually each request's last token) -> float32 logits [N, vocab]."""
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        return F.linear(hidden, weight).float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (HF parameter name, tensor) pairs in, fusing projections; checks coverage.
        The multimodal checkpoint's `model.language_model.` names are read as the text
        model's; its vision tower and multi-token-prediction head are skipped."""
        targets, stacked = self._targets(), self._stacked_experts()
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.replace("model.language_model.", "model.", 1)
            if not name.startswith(("model.", "lm_head.", "mtp.")):
                name = "model." + name  # a bare model's names
            if _IGNORED.fullmatch(name) or (name == "lm_head.weight" and self.lm_head is None):
                continue
            if name in stacked:  # transformers 5's in-memory expert tensors
                copy, covered = stacked[name]
                copy(tensor)
                loaded.update(covered)
                continue
            if name not in targets:
                raise ValueError(f"unexpected weight {name!r}")
            targets[name](tensor)
            loaded.add(name)
        missing = sorted(set(targets) - loaded)
        if missing:
            shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
            raise ValueError(f"checkpoint is missing {len(missing)} weights: {shown}")
        self.final_norm = _plus_one(self.norm)
        for layer in self.blocks:
            layer.finalize()

    def _targets(self) -> dict[str, Callable[[torch.Tensor], None]]:
        """HF name -> what copies that tensor into its place."""
        out = {"model.embed_tokens.weight": _into(self.embed_tokens)}
        out["model.norm.weight"] = _into(self.norm)
        if self.lm_head is not None:
            out["lm_head.weight"] = _into(self.lm_head)
        for i, layer in enumerate(self.blocks):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = _into(layer.input_norm)
            out[p + "post_attention_layernorm.weight"] = _into(layer.post_norm)
            out.update(_mlp_targets(p + "mlp.", layer))
            if layer.linear_attn is not None:
                net = layer.linear_attn
                if self.config.model_type == "qwen3_next":
                    out.update(_next_delta_net_targets(p + "linear_attn.", net))
                else:
                    out.update(_delta_net_targets(p + "linear_attn.", net))
            if layer.self_attn is not None:
                out.update(_attention_targets(p + "self_attn.", layer.self_attn))
        return out

    def _stacked_experts(self) -> dict[str, tuple[Callable[[torch.Tensor], None], list[str]]]:
        """Stacked expert tensor name -> (its copy, the per-expert names it stands for)."""
        out = {}
        for i, layer in enumerate(self.blocks):
            if layer.moe is None:
                continue
            p, experts = f"model.layers.{i}.mlp.experts.", range(layer.moe.num_experts)
            parts = [f"{p}{e}.{x}_proj.weight" for e in experts for x in ("gate", "up")]
            out[p + "gate_up_proj"] = (_into(layer.moe.gate_up_weight), parts)  # [E, 2I, H]
            downs = [f"{p}{e}.down_proj.weight" for e in experts]
            out[p + "down_proj"] = (_into(layer.moe.down_weight), downs)
        return out


def _mlp_targets(p: str, layer: Qwen3_5Layer) -> dict[str, Callable[[torch.Tensor], None]]:
    """The dense MLP's, or the experts', the router's and the shared expert's."""
    out = {}
    moe = layer.moe
    if moe is not None:
        out[p + "gate.weight"] = _into(moe.router_weight)
        size = moe.intermediate
        for e in range(moe.num_experts):
            out[f"{p}experts.{e}.gate_proj.weight"] = _into(moe.gate_up_weight[e, :size])
            out[f"{p}experts.{e}.up_proj.weight"] = _into(moe.gate_up_weight[e, size:])
            out[f"{p}experts.{e}.down_proj.weight"] = _into(moe.down_weight[e])
    if layer.gate_up_weight is None or layer.down_weight is None:
        return out
    if layer.shared_gate is not None:
        out[p + "shared_expert_gate.weight"] = _into(layer.shared_gate)
        p += "shared_expert."
    size = layer.down_weight.shape[1]
    out[p + "gate_proj.weight"] = _into(layer.gate_up_weight[:size])
    out[p + "up_proj.weight"] = _into(layer.gate_up_weight[size:])
    out[p + "down_proj.weight"] = _into(layer.down_weight)
    return out


def _into(target: torch.Tensor) -> Callable[[torch.Tensor], None]:
    def copy(tensor: torch.Tensor) -> None:
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"checkpoint shape {tuple(tensor.shape)}, model {tuple(target.shape)}")
        target.copy_(tensor)

    return copy


def _rows(weight: torch.Tensor, splits: tuple[int, ...]) -> list[torch.Tensor]:
    return list(weight.split(list(splits)))


def _delta_net_targets(p: str, net: GatedDeltaNet) -> dict[str, Callable[[torch.Tensor], None]]:
    qkv, z, b, a = _rows(net.in_weight, net.splits)
    conv = net.conv_weight
    return {
        p + "in_proj_qkv.weight": _into(qkv),
        p + "in_proj_z.weight": _into(z),
        p + "in_proj_b.weight": _into(b),
        p + "in_proj_a.weight": _into(a),
        p + "conv1d.weight": lambda t: _into(conv)(t.reshape(conv.shape)),  # [C, 1, K]
        p + "dt_bias": _into(net.dt_bias),
        p + "A_log": _into(net.A_log),
        p + "norm.weight": _into(net.norm),
        p + "out_proj.weight": _into(net.out_weight),
    }


def _next_delta_net_targets(
    p: str, net: GatedDeltaNet
) -> dict[str, Callable[[torch.Tensor], None]]:
    """Qwen3-Next's fused projections, grouped per key head (its q, k, value heads' v, z,
    then its value heads' b, a), regrouped into Qwen3.5's [q; k; v; z; b; a] rows."""
    out = _delta_net_targets(p, net)
    targets = [out.pop(p + f"in_proj_{x}.weight") for x in ("qkv", "z", "b", "a")]
    heads, dim = net.key_heads, net.key_dim
    values = net.value_heads // net.key_heads * net.value_dim  # per key head

    def qkvz(t: torch.Tensor) -> None:
        q, k, v, z = t.reshape(heads, -1, t.shape[-1]).split([dim, dim, values, values], dim=1)
        parts = [x.reshape(-1, t.shape[-1]) for x in (q, k, v, z)]
        targets[0](torch.cat(parts[:3]))
        targets[1](parts[3])

    def ba(t: torch.Tensor) -> None:
        b, a = t.reshape(heads, 2, -1, t.shape[-1]).unbind(1)
        targets[2](b.reshape(-1, t.shape[-1]))
        targets[3](a.reshape(-1, t.shape[-1]))

    return {**out, p + "in_proj_qkvz.weight": qkvz, p + "in_proj_ba.weight": ba}


def _attention_targets(p: str, at: GatedAttention) -> dict[str, Callable[[torch.Tensor], None]]:
    def q_and_gate(fused: torch.Tensor | None) -> Callable[[torch.Tensor], None]:
        assert fused is not None
        query, gate = fused[: at.q_size], fused[at.q_size + 2 * at.kv_size :]

        def copy(t: torch.Tensor) -> None:  # [Hq * 2D, ...]: per head, its query then gate
            heads = t.reshape(at.num_heads, 2, at.head_dim, *t.shape[1:])
            _into(query)(heads[:, 0].reshape(query.shape))
            _into(gate)(heads[:, 1].reshape(gate.shape))

        return copy

    def kv(fused: torch.Tensor | None, which: int) -> Callable[[torch.Tensor], None]:
        assert fused is not None
        start = at.q_size + which * at.kv_size
        return _into(fused[start : start + at.kv_size])

    out = {
        p + "q_proj.weight": q_and_gate(at.qkvg_weight),
        p + "k_proj.weight": kv(at.qkvg_weight, 0),
        p + "v_proj.weight": kv(at.qkvg_weight, 1),
        p + "o_proj.weight": _into(at.o_weight),
        p + "q_norm.weight": _into(at.q_norm),
        p + "k_norm.weight": _into(at.k_norm),
    }
    if at.qkvg_bias is not None and at.o_bias is not None:
        out[p + "q_proj.bias"] = q_and_gate(at.qkvg_bias)
        out[p + "k_proj.bias"] = kv(at.qkvg_bias, 0)
        out[p + "v_proj.bias"] = kv(at.qkvg_bias, 1)
        out[p + "o_proj.bias"] = _into(at.o_bias)
    return out
