"""Gemma 4 text models (transformers' `Gemma4ForCausalLM`, `model_type` "gemma4_text"; also the
text model of a multimodal `Gemma4ForConditionalGeneration` checkpoint, whose
`model.language_model.` weights are read as the text model's and whose vision and audio towers
are skipped).

Gemma 3's block (four RMSNorms a layer, GeGLU MLP, scaled embeddings, q/k norms, sliding-window
layers with a local RoPE beside full-attention ones, final-logit soft-capping), with Gemma 4's
differences, each as transformers' `modeling_gemma4.py` computes it:

- RMSNorms scale by `weight` itself (not 1 + w), in float32; values get one without a scale
  (v_norm); attention is not scaled (scale 1: the q/k norms set the logits' size);
- per-layer head sizes: full-attention layers have `global_head_dim` (and, with
  `attention_k_eq_v`, `num_global_key_value_heads` and no v_proj: values are the keys'
  projection before k_norm and RoPE), so the KV cache holds mixed shapes
  (`model_api/kv_layout.py`);
- RoPE over the whole head for both types; the global one may be "proportional": only the first
  `partial_rotary_factor * head_dim / 2` frequency pairs rotate (the rest have frequency 0);
- KV-shared layers (the last `num_kv_shared_layers`) have no k/v projections: they attend over
  the K/V of the last earlier layer of their type, which they hand the attention backend again
  (the same values to the same slots) under that layer's KV id, so they own no KV memory;
  with `use_double_wide_mlp` their MLP is twice as wide;
- per-layer inputs (`hidden_size_per_layer_input`): a second embedding table
  (`embed_tokens_per_layer`, scaled by sqrt of its width) plus a projection of the embeddings,
  normed, summed and scaled by 1/sqrt(2), gives each layer a vector that gates (GELU) a
  bottleneck added to the residual after the MLP;
- every layer's output is multiplied by its `layer_scalar`;
- the MoE block (`enable_moe_block`): beside the dense MLP, a router (RMSNorm without scale,
  times `scale` and 1/sqrt(hidden), softmax, top-k renormalised, times `per_expert_scale`) over
  GeGLU experts fed the pre-MLP residual; dense and expert outputs are normed apart and summed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from localradix.model_api.attention import AttentionBackend
from localradix.model_api.tp_comm import SINGLE, TPComm
from localradix.models.config import ModelConfig
from localradix.models.decoder import _Factory
from localradix.models.gemma4_config import Gemma4Extras, Gemma4Rope
from localradix.models.moe import MoEBlock
from localradix.models.rotary import apply_rotary

_GELU_APPROXIMATION = {"gelu_pytorch_tanh": "tanh", "gelu_tanh": "tanh", "gelu": "none"}
_IGNORED = re.compile(
    r"model\.(vision_tower|audio_tower|embed_vision|embed_audio)\..*|.*rotary_emb\..*"
)


def norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Gemma 4's RMSNorm: in float32, times `weight` (float32) if any, cast back."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight, eps).to(x.dtype)


def rope_table(
    rope: Gemma4Rope, dim: int, positions: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [positions, dim] (see rotary.py), as transformers computes them."""
    pairs = int(rope.partial * dim // 2) if rope.rope_type == "proportional" else dim // 2
    exponents = torch.arange(0, 2 * pairs, 2, dtype=torch.int64).float() / dim
    inv_freq = torch.cat([1.0 / (rope.theta**exponents), torch.zeros(dim // 2 - pairs)])
    inv_freq = inv_freq / rope.factor
    freqs = torch.arange(positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    cos = torch.cat([cos, cos], dim=-1).to(device=device, dtype=dtype)
    return cos, torch.cat([-sin, sin], dim=-1).to(device=device, dtype=dtype)


class Gemma4Experts(MoEBlock):
    """The MoE block's router and GeGLU experts (stacked as `moe.py`'s)."""

    def __init__(self, config: ModelConfig, new: _Factory, approximate: str) -> None:
        super().__init__(config, new)
        self.approximate = approximate
        self.scale = new(config.hidden_size)
        self.per_expert_scale = new(config.num_experts)
        self.root = config.hidden_size**-0.5
        self.eps = config.rms_norm_eps

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = norm(x, None, self.eps) * self.scale * self.root
        probs = F.softmax(F.linear(h, self.router_weight).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[ids], ids

    def activate(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)
        return F.gelu(gate, approximate=self.approximate) * up

    def experts(self, x: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        """x [T, H] (the pre-normed input), routed by the residual `routed` -> [T, H]."""
        weights, ids = self.route(routed)
        if x.shape[0] * self.top_k <= self.num_experts:
            return self._gathered(x, weights, ids).to(x.dtype)
        return self._dense(x, weights, ids).to(x.dtype)


class Gemma4Layer(nn.Module):
    def __init__(self, c: ModelConfig, g: Gemma4Extras, i: int, new: _Factory) -> None:
        super().__init__()
        self.eps, self.sliding = c.rms_norm_eps, g.sliding[i]
        self.approximate = _GELU_APPROXIMATION[c.hidden_act]
        self.head_dim = c.head_dim if self.sliding else g.global_head_dim
        kv_heads = c.num_key_value_heads if self.sliding else g.global_kv_heads
        self.num_heads, self.kv_heads = c.num_attention_heads, kv_heads
        self.shared, self.kv_id = i >= g.first_shared, g.kv_sources[i]
        self.k_eq_v = g.k_eq_v and not self.sliding
        hidden, q_size = c.hidden_size, c.num_attention_heads * self.head_dim
        w: dict[str, nn.Parameter] = {
            "self_attn.q_proj.weight": new(q_size, hidden),
            "self_attn.q_norm.weight": new(self.head_dim),
            "self_attn.o_proj.weight": new(hidden, q_size),
        }
        if not self.shared:
            w["self_attn.k_proj.weight"] = new(kv_heads * self.head_dim, hidden)
            w["self_attn.k_norm.weight"] = new(self.head_dim)
            if not self.k_eq_v:
                w["self_attn.v_proj.weight"] = new(kv_heads * self.head_dim, hidden)
        width = c.intermediate_size * (2 if g.double_wide_mlp and self.shared else 1)
        w["mlp.gate_proj.weight"] = new(width, hidden)
        w["mlp.up_proj.weight"] = new(width, hidden)
        w["mlp.down_proj.weight"] = new(hidden, width)
        norms = ["input_layernorm", "post_attention_layernorm"]
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        self.per_layer = g.per_layer_size
        if self.per_layer:
            w["per_layer_input_gate.weight"] = new(self.per_layer, hidden)
            w["per_layer_projection.weight"] = new(hidden, self.per_layer)
            norms.append("post_per_layer_input_norm")
        self.moe = Gemma4Experts(c, new, self.approximate) if c.num_experts else None
        if self.moe is not None:
            norms += ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2"]
            norms.append("pre_feedforward_layernorm_2")
            w["router.proj.weight"] = self.moe.router_weight
            w["router.scale"] = self.moe.scale
            w["router.per_expert_scale"] = self.moe.per_expert_scale
            w["experts.gate_up_proj"] = self.moe.gate_up_weight
            w["experts.down_proj"] = self.moe.down_weight
        w.update({f"{n}.weight": new(hidden) for n in norms})
        self.weights = w
        for name, p in w.items():
            if not name.startswith(("router.", "experts.")):
                self.register_parameter(name.replace(".", "_"), p)
        self.layer_scalar = nn.Parameter(torch.ones_like(new(1)), requires_grad=False)
        self.f: dict[str, torch.Tensor] = {}  # float32 norm weights, by finalize()

    def finalize(self) -> None:
        self.f = {n: p.detach().float() for n, p in self.weights.items() if "norm" in n}

    def forward(
        self,
        x: torch.Tensor,
        per_layer: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionBackend,
        kv: dict[int, tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        w, f, eps, tokens = self.weights, self.f, self.eps, x.shape[0]
        h = norm(x, f["input_layernorm.weight"], eps)
        q = F.linear(h, w["self_attn.q_proj.weight"]).view(tokens, -1, self.head_dim)
        q = apply_rotary(norm(q, f["self_attn.q_norm.weight"], eps), cos, sin)
        if self.shared:
            k, v = kv[self.kv_id]
        else:
            k = F.linear(h, w["self_attn.k_proj.weight"]).view(tokens, -1, self.head_dim)
            v = k if self.k_eq_v else F.linear(h, w["self_attn.v_proj.weight"])
            v = norm(v.view(tokens, -1, self.head_dim), None, eps)
            k = apply_rotary(norm(k, f["self_attn.k_norm.weight"], eps), cos, sin)
            kv[self.kv_id] = k, v
        o = attn.forward(q, k, v, self.kv_id, 1.0)
        o = F.linear(o, w["self_attn.o_proj.weight"])
        x = x + norm(o, f["post_attention_layernorm.weight"], eps)
        h = norm(x, f["pre_feedforward_layernorm.weight"], eps)
        gate = F.gelu(F.linear(h, w["mlp.gate_proj.weight"]), approximate=self.approximate)
        h = F.linear(gate * F.linear(h, w["mlp.up_proj.weight"]), w["mlp.down_proj.weight"])
        if self.moe is not None:
            h = norm(h, f["post_feedforward_layernorm_1.weight"], eps)
            e = self.moe.experts(norm(x, f["pre_feedforward_layernorm_2.weight"], eps), x)
            h = h + norm(e, f["post_feedforward_layernorm_2.weight"], eps)
        x = x + norm(h, f["post_feedforward_layernorm.weight"], eps)
        if per_layer is not None:
            gate = F.gelu(
                F.linear(x, w["per_layer_input_gate.weight"]), approximate=self.approximate
            )
            h = F.linear(gate * per_layer, w["per_layer_projection.weight"])
            x = x + norm(h, f["post_per_layer_input_norm.weight"], eps)
        return x * self.layer_scalar


class Gemma4ForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T], attn) -> hidden [T, H]; compute_logits -> fp32."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
        tp: TPComm = SINGLE,
    ) -> None:
        super().__init__()
        c, g = config, config.gemma4
        if g is None:
            raise ValueError(f"{c.architecture}: not a Gemma 4 config")
        if tp.size > 1:
            raise ValueError(f"--tp {tp.size} does not split {c.architecture} yet: use --tp 1")
        if c.hidden_act not in _GELU_APPROXIMATION:
            raise ValueError(f"Gemma 4 with hidden_activation {c.hidden_act!r} is not supported")
        self.config, self.extras, self.dtype = c, g, dtype
        self.device = torch.device(device)
        self.eps, self.final_cap = c.rms_norm_eps, c.final_logit_softcap
        new = _Factory(dtype, self.device)
        self.embed_tokens = new(c.vocab_size, c.hidden_size)
        self.embed_scale = torch.tensor(c.embed_scale).to(dtype)  # rounded as transformers does
        self.norm = new(c.hidden_size)
        self.lm_head = None if c.tie_word_embeddings else new(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Gemma4Layer(c, g, i, new) for i in range(c.num_hidden_layers))
        top = {"model.embed_tokens.weight": self.embed_tokens, "model.norm.weight": self.norm}
        if self.lm_head is not None:
            top["lm_head.weight"] = self.lm_head
        p = g.per_layer_size
        if p:
            layers = c.num_hidden_layers
            self.embed_per_layer = new(g.per_layer_vocab, layers * p)
            self.per_layer_projection = new(layers * p, c.hidden_size)
            self.per_layer_norm = new(p)
            top["model.embed_tokens_per_layer.weight"] = self.embed_per_layer
            top["model.per_layer_model_projection.weight"] = self.per_layer_projection
            top["model.per_layer_projection_norm.weight"] = self.per_layer_norm
            self.per_layer_scale = torch.tensor(p**0.5).to(dtype)
            self.f_per_layer_norm = self.per_layer_norm.detach().float()
        self.targets: dict[str, torch.Tensor] = dict(top)
        self.optional: dict[str, torch.Tensor] = {}  # loaded when given, else the default
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Gemma4Layer)
            for name, param in layer.weights.items():
                self.targets[f"model.layers.{i}.{name}"] = param
            self.optional[f"model.layers.{i}.layer_scalar"] = layer.layer_scalar
        positions = max_positions or c.max_position_embeddings
        self.local = rope_table(g.local_rope, c.head_dim, positions, dtype, self.device)
        self.full = rope_table(g.global_rope, g.global_head_dim, positions, dtype, self.device)
        self.f_norm = self.norm.detach().float()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed_tokens) * self.embed_scale
        per_layer = self._per_layer_inputs(input_ids, x)
        tables = [
            (t[0][positions].unsqueeze(1), t[1][positions].unsqueeze(1))
            for t in (self.local, self.full)
        ]
        kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Gemma4Layer)
            cos, sin = tables[0] if layer.sliding else tables[1]
            ple = None if per_layer is None else per_layer[:, i]
            x = layer.forward(x, ple, cos, sin, attn, kv)
        return norm(x, self.f_norm, self.eps)

    def _per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
        """[T, layers, per_layer_size]: each layer's input from the tokens and embeddings."""
        p = self.extras.per_layer_size
        if not p:
            return None
        layers, tokens = len(self.layers), ids.shape[0]
        token = F.embedding(ids, self.embed_per_layer) * self.per_layer_scale
        proj = F.linear(x, self.per_layer_projection) * self.config.hidden_size**-0.5
        proj = norm(proj.view(tokens, layers, p), self.f_per_layer_norm, self.eps)
        return (proj + token.view(tokens, layers, p)) * 2.0**-0.5

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> float32 logits [N, vocab], soft-capped when configured."""
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        logits = F.linear(hidden, weight)
        if self.final_cap:
            logits = torch.tanh(logits / self.final_cap) * self.final_cap
        return logits.float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (HF parameter name, tensor) pairs in; checks every weight came."""
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.replace("model.language_model.", "model.", 1)
            if not name.startswith(("model.", "lm_head.")):
                name = "model." + name  # a bare model's names
            if _IGNORED.fullmatch(name) or (name == "lm_head.weight" and self.lm_head is None):
                continue
            target = self.targets.get(name, self.optional.get(name))
            if target is None:
                raise ValueError(f"unexpected weight {name!r}")
            if target.shape != tensor.shape:
                raise ValueError(
                    f"{name}: checkpoint {tuple(tensor.shape)}, model {tuple(target.shape)}"
                )
            target.copy_(tensor)
            loaded.add(name)
        missing = sorted(set(self.targets) - loaded)
        if missing:
            shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
            raise ValueError(f"checkpoint is missing {len(missing)} weights: {shown}")
        for layer in self.layers:
            assert isinstance(layer, Gemma4Layer)
            layer.finalize()
        self.f_norm = self.norm.detach().float()
        if self.extras.per_layer_size:
            self.f_per_layer_norm = self.per_layer_norm.detach().float()
