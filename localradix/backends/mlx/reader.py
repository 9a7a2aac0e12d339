"""WeightReader: takes the MLX models' named arrays out of a checkpoint dict, checking shapes
and that every weight is used exactly as the torch loader (models/weights.py) would.

Mixtral's expert names are read as Qwen3-MoE's (`block_sparse_moe.experts.N.w1/w3/w2` ->
`mlp.experts.N.gate_proj/up_proj/down_proj`, the router `block_sparse_moe.gate` -> `mlp.gate`),
so the MoE block asks for one set of names.
"""

from __future__ import annotations

import re

import mlx.core as mx

from localradix.backends.mlx.quant import Dense, Quantized

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
FREQ_FACTORS = "model.rotary_emb.freq_factors"  # GGUF `rope_freqs`
_MIXTRAL_MOE = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.")
_MIXTRAL_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def canonical(name: str) -> str:
    """Mixtral's MoE names as Qwen3-MoE's; any other name as it is."""
    if _MIXTRAL_MOE.match(name) is None:
        return name
    name = _MIXTRAL_MOE.sub(r"\1mlp.", name, count=1)
    return re.sub(
        r"(\.experts\.\d+\.)(w[123])\.", lambda m: m[1] + _MIXTRAL_EXPERT[m[2]] + ".", name
    )


class WeightReader:
    """Takes named arrays out of a checkpoint dict, checking shapes and coverage."""

    def __init__(self, weights: dict[str, mx.array | Quantized], dtype: mx.Dtype) -> None:
        self.weights = {canonical(name): array for name, array in weights.items()}
        self.dtype = dtype
        self.used: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.weights

    def take(self, name: str, shape: tuple[int, ...], dtype: mx.Dtype | None = None) -> mx.array:
        """A float array, in `dtype` (default: the model's)."""
        return self.raw(name, shape).astype(dtype or self.dtype)

    def raw(self, name: str, shape: tuple[int, ...]) -> mx.array:
        """An array as the checkpoint stores it (MXFP4 blocks stay bytes)."""
        if name not in self.weights:
            raise ValueError(f"checkpoint is missing weight {name!r}")
        array = self.weights[name]
        if isinstance(array, Quantized):
            raise ValueError(f"{name} is quantized; only linear layers and embeddings may be")
        if tuple(array.shape) != shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(array.shape)}, model {shape}")
        self.used.add(name)
        return array

    def linear(self, name: str, shape: tuple[int, int]) -> Dense | Quantized:
        """A [out, in] matrix: float (in the model dtype) or quantized as stored."""
        array = self.weights.get(name)
        if not isinstance(array, Quantized):
            return Dense(self.take(name, shape))
        array.check(name)
        if array.shape != shape:
            raise ValueError(f"{name}: checkpoint shape {array.shape}, model {shape}")
        self.used.add(name)
        return array.astype(self.dtype)

    def optional(self, name: str, shape: tuple[int, ...]) -> mx.array | None:
        return self.take(name, shape) if name in self.weights else None

    def check_all_used(self) -> None:
        extra = sorted(
            n for n in self.weights if n not in self.used and not n.endswith(_IGNORED_SUFFIXES)
        )
        extra = [n for n in extra if n not in ("lm_head.weight", FREQ_FACTORS)]
        if extra:
            shown = ", ".join(extra[:8]) + (" ..." if len(extra) > 8 else "")
            raise ValueError(f"unexpected weights in checkpoint: {shown}")
