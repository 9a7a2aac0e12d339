"""Rotary position embedding for the MLX models (HF "rotate half" layout), like models/rotary.py.

Inverse frequencies are computed in numpy float32 exactly as transformers does; cos/sin are
computed per step for the step's positions (no table), with rotate_half's sign folded into sin.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from localradix.models.config import ModelConfig, RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """float32 [head_dim // 2] inverse frequencies, scaled as the config says."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)
    if scaling.rope_type in ("default", None):
        return inv_freq
    if scaling.rope_type == "linear":
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    if scaling.rope_type == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    raise NotImplementedError(f"RoPE scaling type {scaling.rope_type!r} is not supported")


def _llama3_scaled(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    old_len = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old_len / s.low_freq_factor, old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


class Rotary:
    def __init__(self, config: ModelConfig, dtype: mx.Dtype, freq_factors: np.ndarray | None):
        inv_freq = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
        if freq_factors is not None:  # llama.cpp stores llama3-style scaling as divisors
            inv_freq = (inv_freq / freq_factors.astype(np.float32)).astype(np.float32)
        self.inv_freq = mx.array(inv_freq)
        self.dtype = dtype

    def lookup(self, positions: mx.array) -> tuple[mx.array, mx.array]:
        """cos, signed sin [T, 1, D] for int positions [T], in the model dtype."""
        freqs = positions.astype(mx.float32)[:, None] * self.inv_freq[None, :]  # [T, D/2]
        cos, sin = mx.cos(freqs), mx.sin(freqs)
        cos = mx.concatenate([cos, cos], axis=-1)[:, None, :]
        sin = mx.concatenate([-sin, sin], axis=-1)[:, None, :]
        return cos.astype(self.dtype), sin.astype(self.dtype)


def apply_rotary(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """x [T, H, D] -> x * cos + rotate_half(x) * sin (rotate_half's sign lives in `sin`)."""
    half = x.shape[-1] // 2
    rolled = mx.concatenate([x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rolled * sin
