"""Rotary position embedding (HF "rotate half" layout) with a cos/sin table indexed by position.

The table is computed in float32 exactly as transformers does (positions * inv_freq, then
cos/sin) and stored in the model dtype, so indexing it equals transformers' on-the-fly values.
The sign of rotate_half is folded into the sin table, so applying RoPE is roll + mul + addcmul.
With partial RoPE the table covers only the rotated leading dims of a head. Applying it
(`apply_rotary`, re-exported here) lives with the fused ops in `model_api/layer_ops.py`.
"""

from __future__ import annotations

import math

import torch

from localradix.model_api.layer_ops import apply_partial_rotary as apply_partial_rotary
from localradix.model_api.layer_ops import apply_rotary as apply_rotary
from localradix.models.config import ModelConfig, RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """float32 [head_dim // 2] inverse frequencies, scaled as the config says."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling.rope_type in ("default", None):
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    if scaling.rope_type == "yarn":
        return _yarn_scaled(head_dim, theta, scaling)
    if scaling.rope_type == "longrope":
        raise ValueError("longrope frequencies depend on the position: use position_angles")
    raise NotImplementedError(f"RoPE scaling type {scaling.rope_type!r} is not supported")


def position_angles(
    positions: torch.Tensor, dim: int, theta: float, scaling: RopeScaling
) -> torch.Tensor:
    """float32 [P, dim // 2] rotation angles of these (float) positions."""
    if scaling.rope_type != "longrope":
        return positions[:, None] * inverse_frequencies(dim, theta, scaling)[None, :]
    short = positions[:, None] * _longrope_inverse(dim, theta, scaling.short_factor)[None, :]
    long = positions[:, None] * _longrope_inverse(dim, theta, scaling.long_factor)[None, :]
    # transformers uses the long factors for a whole call once its last position is past the
    # pretraining length; decoding token by token that means "from this position on", the only
    # reading a position-indexed KV cache (shared, chunked, recomputed) can keep consistent.
    from_long = positions >= scaling.original_max_position_embeddings
    return torch.where(from_long[:, None], long, short)


def _longrope_inverse(dim: int, theta: float, factors: tuple[float, ...]) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * theta**exponents)


def _llama3_scaled(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    old_len = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old_len / s.low_freq_factor, old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_scaled(dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """YaRN: interpolated (divided by `factor`) low frequencies, extrapolated (kept) high ones,
    a linear ramp between, over dims found from beta_fast / beta_slow rotations in the
    pretraining length; op for op transformers' `_compute_yarn_parameters` (the cos/sin scale,
    `attention_factor`, is applied by RotaryTable)."""
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (s.factor * pos_freqs)

    def correction_dim(rotations: float) -> float:
        length = s.original_max_position_embeddings
        return (dim * math.log(length / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # (transformers' guard against a zero-width ramp)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # the share of each dim that extrapolates
    return interpolated * (1 - keep) + extrapolated * keep


class RotaryTable:
    """cos / signed-sin tables [max_positions, rotary_dim] in the model dtype."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        max_positions: int | None = None,
        freq_factors: torch.Tensor | None = None,
    ) -> None:
        self.rotary_dim = dim = config.rotary_dim
        self.max_positions = max_positions or config.max_position_embeddings
        positions = torch.arange(self.max_positions, dtype=torch.int64).float()
        scaling = config.rope_scaling
        if freq_factors is None:
            freqs = position_angles(positions, dim, config.rope_theta, scaling)  # [P, D/2]
        else:  # llama.cpp stores llama3-style scaling as divisors
            inv_freq = inverse_frequencies(dim, config.rope_theta, scaling)
            freqs = positions[:, None] * (inv_freq / freq_factors.float().cpu())[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if scaling.attention_factor != 1.0:  # longrope's, yarn's scale: on both, as transformers
            cos, sin = cos * scaling.attention_factor, sin * scaling.attention_factor
        self.cos = torch.cat([cos, cos], dim=-1).to(device=device, dtype=dtype)
        self.sin = torch.cat([-sin, sin], dim=-1).to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin for these positions, shaped [T, 1, D] to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
