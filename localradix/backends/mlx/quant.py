"""Weights of the MLX linear layers and embeddings: float, or quantized as MLX stores them.

A quantized weight is MLX's own triple (uint32-packed `weight` [out, in * bits / 32], `scales`
and, for affine, `biases` [out, in / group]) used by `mx.quantized_matmul` and `mx.dequantize`
exactly as `nn.QuantizedLinear` / `nn.QuantizedEmbedding` use them, so a checkpoint written by
mlx-lm (or a GGUF's Q4_0/Q4_1/Q8_0 blocks, see gguf_weights.py) is used without dequantizing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

AFFINE_BITS = (2, 3, 4, 5, 6, 8)
FP_MODES = {"mxfp4": (32, 4), "mxfp8": (32, 8)}  # mode -> (group size, bits), fixed by the format
DEFAULT_GROUP = 64  # mlx-lm's convert default for affine quantization


@dataclass(frozen=True)
class QuantSpec:
    group_size: int
    bits: int
    mode: str = "affine"

    def __post_init__(self) -> None:
        if self.mode == "affine":
            ok = self.bits in AFFINE_BITS and self.group_size in (32, 64, 128)
        else:
            ok = FP_MODES.get(self.mode) == (self.group_size, self.bits)
        if not ok:
            raise ValueError(f"unsupported MLX quantization {self}")

    @staticmethod
    def parse(choice: str) -> QuantSpec:
        """`--quantize` value ("4", "mxfp4", ...) -> the spec weights are quantized to at load."""
        if choice in FP_MODES:
            group, bits = FP_MODES[choice]
            return QuantSpec(group, bits, choice)
        return QuantSpec(DEFAULT_GROUP, int(choice))

    @staticmethod
    def from_dict(d: dict[str, Any]) -> QuantSpec:
        """A config.json "quantization" entry; missing keys take `nn.quantize`'s defaults."""
        mode = d.get("mode", "affine")
        group, bits = FP_MODES.get(mode, (DEFAULT_GROUP, 4))
        return QuantSpec(int(d.get("group_size", group)), int(d.get("bits", bits)), mode)


@dataclass(frozen=True)
class Dense:
    weight: mx.array  # [out, in]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.weight.shape)

    def __call__(self, x: mx.array) -> mx.array:
        return x @ self.weight.T

    def rows(self, ids: mx.array) -> mx.array:
        return self.weight[ids]

    def arrays(self) -> list[mx.array]:
        return [self.weight]


@dataclass(frozen=True)
class Quantized:
    weight: mx.array  # uint32 [out, in * bits / 32]
    scales: mx.array  # [out, in / group]: the model dtype (affine) or uint8 exponents (mxfp)
    biases: mx.array | None  # [out, in / group] for affine; None for the fp modes
    spec: QuantSpec
    dtype: mx.Dtype  # what `rows` dequantizes to

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical [out, in] of the float weight this stands for."""
        return (self.weight.shape[0], self.weight.shape[1] * 32 // self.spec.bits)

    def __call__(self, x: mx.array) -> mx.array:
        return mx.quantized_matmul(
            x, self.weight, self.scales, self.biases, transpose=True, **self._format()
        )

    def rows(self, ids: mx.array) -> mx.array:
        biases = None if self.biases is None else self.biases[ids]
        return mx.dequantize(
            self.weight[ids], self.scales[ids], biases, dtype=self.dtype, **self._format()
        )

    def dequantize(self) -> mx.array:
        return mx.dequantize(
            self.weight, self.scales, self.biases, dtype=self.dtype, **self._format()
        )

    def _format(self) -> dict[str, Any]:
        s = self.spec
        return {"group_size": s.group_size, "bits": s.bits, "mode": s.mode}

    def arrays(self) -> list[mx.array]:
        return [self.weight, self.scales] + ([] if self.biases is None else [self.biases])

    def astype(self, dtype: mx.Dtype) -> Quantized:
        """The same weight with affine scales and biases (and dequantized rows) in `dtype`."""
        return as_quantized(self.weight, self.scales, self.biases, self.spec, dtype)

    def check(self, name: str) -> None:
        """The packed shapes agree with each other and with the spec."""
        out, packed = self.weight.shape
        groups = packed * 32 // self.spec.bits // self.spec.group_size
        want = (out, groups)
        bad = [a for a in self.arrays()[1:] if tuple(a.shape) != want]
        if (
            self.weight.dtype != mx.uint32
            or bad
            or (self.biases is None) != (self.spec.mode != "affine")
        ):
            raise ValueError(f"{name}: quantized tensors do not match {self.spec}")


@dataclass(frozen=True)
class Concat:
    """Layers whose outputs are concatenated: a fused projection that cannot be one matmul
    (its parts are quantized differently, as mixed-precision checkpoints do)."""

    parts: tuple[Dense | Quantized, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    def __call__(self, x: mx.array) -> mx.array:
        return mx.concatenate([p(x) for p in self.parts], axis=-1)

    def arrays(self) -> list[mx.array]:
        return [a for p in self.parts for a in p.arrays()]


Linear = Dense | Quantized | Concat


def fuse(parts: list[Dense | Quantized]) -> Linear:
    """One layer computing the parts' outputs side by side (one matmul where possible)."""
    dense = [p for p in parts if isinstance(p, Dense)]
    if len(dense) == len(parts):
        return Dense(mx.concatenate([p.weight for p in dense]))
    quantized = [p for p in parts if isinstance(p, Quantized)]
    if len(quantized) < len(parts) or len({p.spec for p in quantized}) > 1:
        return Concat(tuple(parts))
    biases = [p.biases for p in quantized if p.biases is not None]
    return Quantized(
        mx.concatenate([p.weight for p in quantized]),
        mx.concatenate([p.scales for p in quantized]),
        mx.concatenate(biases) if biases else None,
        quantized[0].spec,
        quantized[0].dtype,
    )


def quantize(weight: mx.array, spec: QuantSpec, dtype: mx.Dtype) -> Quantized:
    """A float [out, in] weight quantized to `spec` (scales and biases in `dtype`)."""
    packed = mx.quantize(weight, spec.group_size, spec.bits, mode=spec.mode)
    return as_quantized(packed[0], packed[1], packed[2] if len(packed) > 2 else None, spec, dtype)


def as_quantized(
    weight: mx.array, scales: mx.array, biases: mx.array | None, spec: QuantSpec, dtype: mx.Dtype
) -> Quantized:
    """MLX's quantized triple with affine scales and biases cast to the model dtype."""
    if spec.mode == "affine":
        scales = scales.astype(dtype)
        biases = None if biases is None else biases.astype(dtype)
    return Quantized(weight, scales, biases, spec, dtype)
