"""Which slice of the model a tensor-parallel rank holds (pure Python, no torch).

Attention is split by heads (q/k/v column-parallel, o row-parallel), the MLP by intermediate
rows (gate/up column-parallel, down row-parallel), the embedding and LM head by vocab rows
(padded so every rank holds as many). With fewer KV heads than ranks (GQA), each KV head is
replicated on the ranks whose query heads read it. Norms are replicated.

Experts (Mixtral, Qwen3-MoE) are split like the dense MLP, each one by its intermediate rows:
every rank holds every expert's 1/n slice (gate/up rows, down columns) and the whole router,
so it routes alike and its partial output joins the others' in the MLP's all-reduce.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the config is only read here: models/ builds on this package
    from localradix.models.config import ModelConfig

_LAYER = re.compile(r"model\.layers\.\d+\.(.+)")
# One expert's tensor, Qwen3-MoE's names or Mixtral's (w1 gate, w3 up, w2 down).
_EXPERT = re.compile(
    r"(?:mlp|block_sparse_moe)\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight"
)
_EXPERT_ROWS = frozenset({"gate_proj", "up_proj", "w1", "w3"})  # split by rows; down by columns
# Experts stacked in one tensor (gate and up rows in one dim): no single range per rank.
_STACKED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
# Per-layer weights split along the output rows ("rows") or input columns ("cols").
_SPLITS = {
    "self_attn.q_proj.weight": ("rows", "q"),
    "self_attn.q_proj.bias": ("rows", "q"),
    "self_attn.k_proj.weight": ("rows", "kv"),
    "self_attn.k_proj.bias": ("rows", "kv"),
    "self_attn.v_proj.weight": ("rows", "kv"),
    "self_attn.v_proj.bias": ("rows", "kv"),
    "self_attn.o_proj.weight": ("cols", "q"),
    "mlp.gate_proj.weight": ("rows", "mlp"),
    "mlp.up_proj.weight": ("rows", "mlp"),
    "mlp.down_proj.weight": ("cols", "mlp"),
}
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class WeightSlice:
    """Read `start:stop` along `dim` of a checkpoint tensor; pad with zero rows to `rows`."""

    dim: int
    start: int
    stop: int
    rows: int | None = None  # vocab shards: every rank's slice has this many rows


@dataclass(frozen=True)
class Shard:
    rank: int
    size: int

    def check(self, config: ModelConfig) -> None:
        """Raise ValueError when `config` cannot be split over `size` ranks."""
        c, n = config, self.size
        if c.fused_qkv_gate_up and n > 1:  # q/k/v (gate/up) share a tensor: no one range per rank
            raise ValueError(
                f"--tp {n} does not split {c.architecture}'s fused qkv_proj / gate_up_proj "
                "weights: serve it with --tp 1"
            )
        if c.shared_expert_size and n > 1:  # a shared expert beside the routed ones: not yet
            raise ValueError(
                f"--tp {n} does not split {c.architecture}'s shared expert: serve it with --tp 1"
            )
        if any(c.linear_layers) and n > 1:  # their heads and per-request state: not split yet
            raise ValueError(
                f"--tp {n} does not split {c.architecture}'s gated delta-net layers: "
                "serve it with --tp 1"
            )
        # Gemma 3's and 4's blocks, gpt-oss's sinks and o_proj bias: sharding not wired yet
        if (c.offset_norms or c.attention_sinks or c.gemma4) and n > 1:
            raise ValueError(f"--tp {n} does not split {c.architecture} yet: serve it with --tp 1")
        problems = self._uneven(config)
        if problems:
            raise ValueError(f"--tp {n} cannot split {', '.join(problems)} evenly")

    def _uneven(self, config: ModelConfig) -> list[str]:
        """The parts of `config` that do not divide over the ranks, in words."""
        c, n = config, self.size
        problems = []
        if c.num_attention_heads % n:
            problems.append(f"{c.num_attention_heads} attention heads")
        kv = c.num_key_value_heads
        if kv % n and n % kv:
            problems.append(f"{kv} KV heads (need a multiple or a divisor of the ranks)")
        dense = any(not c.uses_moe(i) for i in range(c.num_hidden_layers))
        if dense and c.intermediate_size % n:  # (all-expert models use no dense MLP width)
            problems.append(f"an MLP of {c.intermediate_size}")
        if c.num_experts and c.moe_intermediate_size % n:
            problems.append(f"experts of intermediate size {c.moe_intermediate_size}")
        return problems

    @staticmethod
    def vocab_rows(vocab_size: int, size: int) -> int:
        return -(-vocab_size // size)

    def vocab_start(self, config: ModelConfig) -> int:
        return self.rank * self.vocab_rows(config.vocab_size, self.size)

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The config of this rank's slice: its heads, MLP and expert rows and vocab rows."""
        if self.size == 1:
            return config
        self.check(config)
        return dataclasses.replace(
            config,
            num_attention_heads=config.num_attention_heads // self.size,
            num_key_value_heads=max(config.num_key_value_heads // self.size, 1),
            intermediate_size=config.intermediate_size // self.size,
            moe_intermediate_size=config.moe_intermediate_size // self.size,
            vocab_size=self.vocab_rows(config.vocab_size, self.size),
        )

    def weight_slice(self, name: str, config: ModelConfig) -> WeightSlice | None:
        """The slice of checkpoint tensor `name` this rank holds; None = all of it."""
        if name in _VOCAB:
            rows = self.vocab_rows(config.vocab_size, self.size)
            start = min(self.rank * rows, config.vocab_size)
            return WeightSlice(0, start, min(start + rows, config.vocab_size), rows)
        match = _LAYER.fullmatch(name)
        if match and (expert := _EXPERT.fullmatch(match.group(1))):
            start, stop = self._span("experts", config)
            return WeightSlice(0 if expert.group(1) in _EXPERT_ROWS else 1, start, stop)
        if match and match.group(1) in _STACKED:
            raise ValueError(
                f"--tp {self.size} reads experts saved one by one; {name} stacks them: "
                "serve it with --tp 1"
            )
        split = _SPLITS.get(match.group(1)) if match else None
        if split is None:
            return None  # norms, rotary factors: replicated
        axis, what = split
        start, stop = self._span(what, config)
        return WeightSlice(0 if axis == "rows" else 1, start, stop)

    def _span(self, what: str, config: ModelConfig) -> tuple[int, int]:
        c, r, n = config, self.rank, self.size
        if what in ("mlp", "experts"):
            per = (c.intermediate_size if what == "mlp" else c.moe_intermediate_size) // n
            return r * per, (r + 1) * per
        if what == "q":
            per = c.q_size // n
            return r * per, (r + 1) * per
        kv = c.num_key_value_heads
        first, count = (r * kv // n, kv // n) if kv >= n else (r * kv // n, 1)
        return first * c.head_dim, (first + count) * c.head_dim
