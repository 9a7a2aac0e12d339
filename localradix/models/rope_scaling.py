"""RopeScaling: how a config.json's RoPE parameters scale the rotary frequencies, resolved
(pretraining length, factor, cos/sin scale) as transformers resolves them. Imports no torch;
the tables themselves are `rotary.py`'s."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. rope_type: "default", "linear", "llama3", "longrope", "yarn"."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3, yarn; longrope: where long starts
    short_factor: tuple[float, ...] = ()  # longrope: per-frequency divisors below that length
    long_factor: tuple[float, ...] = ()  # longrope: ... and from it on
    attention_factor: float = 1.0  # longrope, yarn: multiplies cos and sin (see from_hf_dict)
    beta_fast: float = 32.0  # yarn: rotations where the ramp to extrapolation starts ...
    beta_slow: float = 1.0  # ... and where it ends
    truncate: bool = True  # yarn: round that ramp's bounds to whole dimensions

    @staticmethod
    def from_hf(params: dict[str, Any] | None) -> RopeScaling:
        if not params:
            return RopeScaling()
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "su":  # Phi-3's first name for longrope
            rope_type = "longrope"
        known = {f.name for f in dataclasses.fields(RopeScaling)} - {"rope_type"}
        values = {k: v for k, v in params.items() if k in known and v is not None}
        return RopeScaling(rope_type=rope_type, **json_tuples(values))


def json_tuples(values: dict[str, Any]) -> dict[str, Any]:
    """Lists (from JSON) as tuples, so the frozen configs stay hashable and compare equal."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def longrope_scaling(
    scaling: RopeScaling, params: dict[str, Any], d: dict[str, Any]
) -> RopeScaling:
    """What transformers' `_compute_longrope_parameters` derives: the pretraining length (a
    top-level key wins, as Phi-3 saves it there) and the cos/sin scale, from the length ratio
    unless the checkpoint gives `factor` or `attention_factor` itself."""
    original = int(
        d.get("original_max_position_embeddings")
        or params.get("original_max_position_embeddings")
        or d.get("max_position_embeddings", 2048)
    )
    factor = params.get("factor")
    if factor is None:
        factor = d.get("max_position_embeddings", 2048) / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return dataclasses.replace(
        scaling,
        factor=float(factor),
        original_max_position_embeddings=original,
        attention_factor=float(attention),
    )


def yarn_scaling(scaling: RopeScaling, params: dict[str, Any], d: dict[str, Any]) -> RopeScaling:
    """What transformers' `_compute_yarn_parameters` derives: the pretraining length (a
    top-level key wins), `factor` from the length ratio when absent, and the cos/sin scale
    (`attention_factor`, else YaRN's 0.1 ln(factor) + 1, or its mscale / mscale_all_dim ratio)."""
    original = int(
        d.get("original_max_position_embeddings")
        or params.get("original_max_position_embeddings")
        or d.get("max_position_embeddings", 2048)
    )
    factor = params.get("factor")
    if factor is None:
        factor = d.get("max_position_embeddings", 2048) / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return dataclasses.replace(
        scaling,
        factor=float(factor),
        original_max_position_embeddings=original,
        attention_factor=float(attention),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        truncate=bool(params.get("truncate", True)),
    )
