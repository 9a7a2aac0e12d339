"""ModelConfig: the typed, frozen subset of a Hugging Face config.json the models use.

Built from a config.json dict (`from_hf_dict`; both the transformers 4 `rope_theta` /
`rope_scaling` keys and the transformers 5 `rope_parameters` key are read) or from GGUF
metadata (see `localradix.loader.gguf`, which first writes an HF-style dict). Imports no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# HF `model_type` -> the `architectures` name used when a config lists none.
MODEL_TYPE_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. rope_type: "default", "linear" or "llama3"."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only

    @staticmethod
    def from_hf(params: dict[str, Any] | None) -> RopeScaling:
        if not params:
            return RopeScaling()
        rope_type = params.get("rope_type", params.get("type", "default"))
        known = {f.name for f in dataclasses.fields(RopeScaling)} - {"rope_type"}
        values = {k: v for k, v in params.items() if k in known and v is not None}
        return RopeScaling(rope_type=rope_type, **values)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None  # recorded, not applied (full attention everywhere)
    torch_dtype: str | None = None  # dtype the checkpoint was saved in
    kv_layers: int | None = None  # layers that keep KV, if not all (hybrids' recurrent ones don't)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @staticmethod
    def from_hf_dict(d: dict[str, Any]) -> ModelConfig:
        model_type = d.get("model_type", "llama")
        archs = d.get("architectures") or [MODEL_TYPE_ARCHITECTURES.get(model_type, "")]
        heads = d["num_attention_heads"]
        rope = d.get("rope_parameters") or {}
        rope_theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling") or rope
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        window = d.get("sliding_window") if d.get("use_sliding_window", True) else None
        return ModelConfig(
            architecture=archs[0],
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=RopeScaling.from_hf(scaling),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=model_type == "qwen2" or bool(d.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            hidden_act=d.get("hidden_act", "silu"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            sliding_window=window,
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "") or None,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ModelConfig:
        """Inverse of `to_dict` (used by the GGUF conversion cache)."""
        values = dict(d)
        values["rope_scaling"] = RopeScaling(**values.get("rope_scaling", {}))
        values["eos_token_ids"] = tuple(values.get("eos_token_ids", ()))
        return ModelConfig(**values)
