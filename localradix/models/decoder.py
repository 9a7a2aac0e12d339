"""One decoder-only transformer for the Llama family, Mistral, Qwen2, Qwen3, Phi-3/4, SmolLM3,
Mixtral and Qwen3-MoE.

Differences are config flags: q/k/v bias (Qwen2), per-head q/k RMSNorm (Qwen3), tied
embeddings, GQA, RoPE theta/scaling (longrope: Phi-3), partial RoPE (Phi-4-mini), layers
without RoPE (SmolLM3), a mixture-of-experts MLP (`moe.py`: Mixtral, Qwen3-MoE, whose
`mlp_only_layers` / `decoder_sparse_step` keep some layers dense); Phi-3's fused checkpoint
names are the weight loader's business. The hot path is lean on purpose: fused qkv and
gate_up matmuls, q/k norm + RoPE + K/V store as one backend call (`attn.rope_store`),
functional ops on raw parameters, and layers called via `.forward` (no nn.Module hook
machinery), because per-op Python overhead dominates small models on CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from localradix.model_api.attention import AttentionBackend
from localradix.model_api.shard import Shard
from localradix.model_api.tp_comm import SINGLE, TPComm
from localradix.models.config import ModelConfig
from localradix.models.moe import MoEBlock
from localradix.models.rotary import RotaryTable, apply_partial_rotary, apply_rotary
from localradix.models.weights import WeightLoader


class _Factory:
    """Allocates uninitialised, frozen parameters directly in the target dtype and device."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device

    def __call__(self, *shape: int) -> nn.Parameter:
        data = torch.empty(*shape, dtype=self.dtype, device=self.device)
        return nn.Parameter(data, requires_grad=False)


Rotation = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_CosSin = tuple[torch.Tensor | None, torch.Tensor | None]  # (None, None): a layer without RoPE


def _rotation(config: ModelConfig, layer_id: int) -> Rotation | None:
    """How this layer applies RoPE to q and k, chosen once so the forward only calls it."""
    if not config.uses_rope(layer_id):
        return None  # a NoPE layer: attention sees no positions
    return apply_rotary if config.rotary_dim == config.head_dim else apply_partial_rotary


class DecoderLayer(nn.Module):
    moe_class: type[MoEBlock] = MoEBlock  # (a family's own experts: models/gpt_oss.py)

    def __init__(
        self, config: ModelConfig, layer_id: int, new: _Factory, tp: TPComm = SINGLE
    ) -> None:
        super().__init__()
        c = config  # this rank's slice under tensor parallelism (its heads and MLP rows)
        self.tp = tp
        self.layer_id = layer_id
        self.eps = c.rms_norm_eps
        self.hidden_shape = (c.hidden_size,)
        self.head_dim = c.head_dim
        self.num_heads = c.num_attention_heads
        self.num_qk_heads = c.num_attention_heads + c.num_key_value_heads
        self.qk_size = c.q_size + c.kv_size
        self.scale = c.head_dim**-0.5
        self.rotate = _rotation(c, layer_id)
        self.input_norm = new(c.hidden_size)
        self.qkv_weight = new(c.q_size + 2 * c.kv_size, c.hidden_size)
        self.qkv_bias = new(c.q_size + 2 * c.kv_size) if c.attention_bias else None
        self.q_norm = new(c.head_dim) if c.qk_norm else None
        self.k_norm = new(c.head_dim) if c.qk_norm else None
        self.qk_norm_weight: torch.Tensor | None = None  # [Hq + Hkv, D], built by finalize()
        self.o_weight = new(c.hidden_size, c.q_size)
        self.post_norm = new(c.hidden_size)
        self.moe = self.moe_class(c, new) if c.uses_moe(layer_id) else None  # else dense:
        dense = self.moe is None
        self.gate_up_weight = new(2 * c.intermediate_size, c.hidden_size) if dense else None
        self.down_weight = new(c.hidden_size, c.intermediate_size) if dense else None

    def finalize(self) -> None:
        """Derive the fused per-head q/k norm weight once all weights are loaded."""
        if self.q_norm is not None and self.k_norm is not None:
            num_kv = self.num_qk_heads - self.num_heads
            q = self.q_norm.detach().expand(self.num_heads, -1)
            k = self.k_norm.detach().expand(num_kv, -1)
            self.qk_norm_weight = torch.cat([q, k]).contiguous()

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]: previous layer's output (or the embeddings)
        residual: torch.Tensor | None,  # [T, hidden]: running residual stream
        cos: torch.Tensor,  # [T, 1, rotary_dim]
        sin: torch.Tensor,  # [T, 1, rotary_dim]
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = attn.ops.add_rms_norm(x, residual, self.input_norm, self.eps)
        qkv = F.linear(h, self.qkv_weight, self.qkv_bias)  # [T, (Hq + 2 Hkv) D]
        tokens = qkv.shape[0]
        qk = qkv[:, : self.qk_size].view(tokens, self.num_qk_heads, self.head_dim)
        v = qkv[:, self.qk_size :].view(tokens, -1, self.head_dim)
        rope: _CosSin = (cos, sin) if self.rotate is not None else (None, None)
        # q/k norm, RoPE and the K/V store: one call (one kernel with the Triton backend)
        q, k = attn.rope_store(qk, v, self.layer_id, *rope, self.qk_norm_weight, self.eps)
        o = attn.forward(q, k, v, self.layer_id, self.scale, stored=True)
        o = self.tp.all_reduce(F.linear(o, self.o_weight))
        h, residual = attn.ops.add_rms_norm(o, residual, self.post_norm, self.eps)
        if self.moe is not None:  # each rank's experts hold a slice of their rows: sum them
            return self.tp.all_reduce(self.moe.forward(h)), residual
        assert self.gate_up_weight is not None and self.down_weight is not None
        act = attn.ops.silu_mul(F.linear(h, self.gate_up_weight))
        return self.tp.all_reduce(F.linear(act, self.down_weight)), residual


class DecoderForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T], attn) -> hidden [T, H]; compute_logits -> fp32.

    With `tp` of several ranks, this is one rank's slice (`model_api/shard.py`): `config` is
    the slice's, and each block half ends with an all-reduce.
    """

    layer_class: type[DecoderLayer] = DecoderLayer  # (a subclass's own block: models/gemma3.py)

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
        tp: TPComm = SINGLE,
    ) -> None:
        super().__init__()
        self.tp, self.vocab_size, self.vocab_start = tp, config.vocab_size, 0
        if tp.size > 1:
            shard = Shard(tp.rank, tp.size)
            self.vocab_start = shard.vocab_start(config)
            config = shard.local_config(config)
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.max_positions = max_positions
        self.eps = config.rms_norm_eps
        new = _Factory(dtype, self.device)
        self.embed_tokens = new(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            self.layer_class(config, i, new, tp) for i in range(config.num_hidden_layers)
        )
        self.norm = new(config.hidden_size)
        self.lm_head = None if config.tie_word_embeddings else new(*self.embed_tokens.shape)
        self.rotary = RotaryTable(config, dtype, self.device, max_positions)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self._embed(input_ids)
        cos, sin = self.rotary.lookup(positions)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            x, residual = layer.forward(x, residual, cos, sin, attn)
        assert residual is not None  # a model has at least one layer
        return attn.ops.add_rms_norm(x, residual, self.norm, self.eps)[0]

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.embed_tokens)
        # Vocab-parallel: each rank embeds the ids in its rows, zeros elsewhere; the sum is exact.
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.embed_tokens.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), self.embed_tokens)
        return self.tp.all_reduce(x.masked_fill_(outside.unsqueeze(-1), 0))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (usually each request's last token) -> float32 logits [N, vocab]."""
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        if self.tp.size == 1:
            return F.linear(hidden, weight).float()
        logits = self.tp.gather_columns(F.linear(hidden, weight).float())
        return logits[:, : self.vocab_size]  # the last rank's rows are padded

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (HF parameter name, tensor) pairs in, fusing qkv and gate_up; checks coverage."""
        loader = WeightLoader(self)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # memory-bound copies; more threads only stall on a busy CPU
        try:
            for name, tensor in weights:
                if name == "model.rotary_emb.freq_factors":  # GGUF `rope_freqs`: rebuild table
                    self.rotary = RotaryTable(
                        self.config, self.dtype, self.device, self.max_positions, tensor
                    )
                    continue
                loader.load(name, tensor)
        finally:
            torch.set_num_threads(threads)
        loader.check_complete()
        for layer in self.layers:
            cast(DecoderLayer, layer).finalize()
