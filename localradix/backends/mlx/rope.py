"""Rotary position embedding for the MLX models (HF "rotate half" layout), like models/rotary.py.

Inverse frequencies are computed in numpy float32 exactly as transformers does (default, linear,
llama3, YaRN, longrope); cos/sin are computed per step for the step's positions (no table), with
rotate_half's sign folded into sin and longrope's / YaRN's `attention_factor` into both. With
partial RoPE (Phi-4-mini) they cover only the leading `rotary_dim` dims of a head.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from localradix.models.config import ModelConfig, RopeScaling


def _exponents(dim: int) -> np.ndarray:
    return np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """float32 [head_dim // 2] inverse frequencies, scaled as the config says (longrope: the
    short factors; `Rotary` switches to the long ones past the pretraining length)."""
    inv_freq = (1.0 / (np.float32(theta) ** _exponents(head_dim))).astype(np.float32)
    if scaling.rope_type in ("default", None):
        return inv_freq
    if scaling.rope_type == "linear":
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    if scaling.rope_type == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    if scaling.rope_type == "yarn":
        return _yarn_scaled(head_dim, theta, scaling)
    if scaling.rope_type == "longrope":
        return _longrope_inverse(head_dim, theta, scaling.short_factor)
    raise NotImplementedError(f"RoPE scaling type {scaling.rope_type!r} is not supported")


def _longrope_inverse(dim: int, theta: float, factors: tuple[float, ...]) -> np.ndarray:
    divisors = np.array(factors, dtype=np.float32) * np.float32(theta) ** _exponents(dim)
    return (1.0 / divisors).astype(np.float32)


def _llama3_scaled(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    old_len = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old_len / s.low_freq_factor, old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def _yarn_scaled(dim: int, theta: float, s: RopeScaling) -> np.ndarray:
    """YaRN's blend of interpolated and extrapolated frequencies (models/rotary.py's)."""
    pos_freqs = np.float32(theta) ** _exponents(dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (np.float32(s.factor) * pos_freqs)

    def correction_dim(rotations: float) -> float:
        length = s.original_max_position_embeddings
        return (dim * math.log(length / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # (transformers' guard against a zero-width ramp)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)  # the share of each dim that extrapolates
    return (interpolated * (1 - keep) + extrapolated * keep).astype(np.float32)


class Rotary:
    """cos / signed sin for a step's positions; `theta` / `scaling` override the config's
    (Gemma 3's local RoPE)."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: mx.Dtype,
        freq_factors: np.ndarray | None = None,
        theta: float | None = None,
        scaling: RopeScaling | None = None,
    ) -> None:
        dim, theta = config.rotary_dim, theta or config.rope_theta
        scaling = config.rope_scaling if scaling is None else scaling
        inv_freq = inverse_frequencies(dim, theta, scaling)
        if freq_factors is not None:  # llama.cpp stores llama3-style scaling as divisors
            inv_freq = (inv_freq / freq_factors.astype(np.float32)).astype(np.float32)
        self.inv_freq = mx.array(inv_freq)
        # longrope: the long factors from the pretraining length on, per position (a whole-call
        # switch, as transformers does, is one no position-indexed KV cache could follow)
        long = scaling.rope_type == "longrope"
        self.long_inv_freq = (
            mx.array(_longrope_inverse(dim, theta, scaling.long_factor)) if long else None
        )
        self.long_from = scaling.original_max_position_embeddings
        self.scale = scaling.attention_factor
        self.dtype = dtype

    def lookup(self, positions: mx.array) -> tuple[mx.array, mx.array]:
        """cos, signed sin [T, 1, rotary_dim] for int positions [T], in the model dtype."""
        at = positions.astype(mx.float32)[:, None]
        freqs = at * self.inv_freq[None, :]  # [T, D/2]
        if self.long_inv_freq is not None:
            long = at * self.long_inv_freq[None, :]
            freqs = mx.where(positions[:, None] >= self.long_from, long, freqs)
        cos, sin = mx.cos(freqs), mx.sin(freqs)
        if self.scale != 1.0:  # longrope's, YaRN's cos/sin scale, as transformers applies it
            cos, sin = cos * self.scale, sin * self.scale
        cos = mx.concatenate([cos, cos], axis=-1)[:, None, :]
        sin = mx.concatenate([-sin, sin], axis=-1)[:, None, :]
        return cos.astype(self.dtype), sin.astype(self.dtype)


def apply_rotary(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """x [T, H, D] -> x * cos + rotate_half(x) * sin (rotate_half's sign lives in `sin`), on
    the leading cos.shape[-1] dims of each head; the rest (partial RoPE) pass through."""
    rot = cos.shape[-1]
    if rot < x.shape[-1]:
        return mx.concatenate([apply_rotary(x[..., :rot], cos, sin), x[..., rot:]], axis=-1)
    half = rot // 2
    rolled = mx.concatenate([x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rolled * sin
