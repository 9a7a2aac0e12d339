"""How much memory a model's weights take once a backend has loaded them, read from the files.

`localradix doctor` prints it per backend (the runners report the real figure once loaded, see
`ModelRunner.weight_bytes`): llama.cpp keeps a GGUF's tensors as stored; MLX keeps Q4_0, Q4_1
and Q8_0 blocks quantized (repacked as affine group-32 with float32 scales and biases) and
re-quantizes the other GGUF types to the nearest width (float16 with `--quantize off`); torch
dequantizes everything to its float dtype. No torch or MLX here: doctor must stay light.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from localradix.model_api.kv_layout import DTYPE_BYTES

GGUF_GROUP = 32  # weights per scale in every GGML block type MLX keeps
MLX_GROUP = 64  # mlx-lm's default group for `--quantize N` at load
AFFINE_BITS = (2, 3, 4, 5, 6, 8)
KEPT_BITS = {2: 4, 3: 4, 8: 8}  # gguf Q4_0, Q4_1, Q8_0 -> bits MLX keeps them at
GGUF_FLOATS = {0, 1, 28, 30}  # F32, F16, F64, BF16
MX_BITS = {"mxfp4": 4, "mxfp8": 8}


@dataclass(frozen=True)
class Tensor:
    """One stored tensor: element count, stored bytes, and its GGML type (None: safetensors)."""

    elements: int
    stored: int
    qtype: int | None = None
    matrix: bool = True  # 2-D: what quantization applies to


def resident_bytes(path: Path, kind: str, backend: str, dtype: str, quantize: str) -> int:
    """Bytes the weights of the model at `path` take resident on `backend` with `dtype`."""
    tensors = list(_gguf_tensors(path) if kind == "gguf" else _safetensors(path))
    if backend == "llamacpp":
        return sum(t.stored for t in tensors)
    if backend == "mlx":
        checkpoint_quantized = kind == "hf" and "quantization" in _config(path)
        return sum(_mlx_bytes(t, dtype, quantize, checkpoint_quantized) for t in tensors)
    return sum(t.elements * DTYPE_BYTES[dtype] for t in tensors)  # torch: dequantized


def _mlx_bytes(t: Tensor, dtype: str, quantize: str, checkpoint_quantized: bool) -> int:
    if checkpoint_quantized:  # an MLX folder: packed weights, scales and biases as stored
        return t.stored
    if t.qtype is not None and t.qtype in KEPT_BITS:
        return _packed(t.elements, KEPT_BITS[t.qtype], GGUF_GROUP)
    if t.qtype is not None and t.qtype not in GGUF_FLOATS and t.matrix:  # K-quants & co.
        if quantize == "off":
            return 2 * t.elements  # float16
        bits = _bits(quantize) or _nearest_bits(t.qtype)
        return _packed(t.elements, bits, GGUF_GROUP)
    at_load = _bits(quantize) if t.qtype is None and t.matrix else None  # --quantize N
    return _packed(t.elements, at_load, MLX_GROUP) if at_load else t.elements * DTYPE_BYTES[dtype]


def _packed(elements: int, bits: int, group: int) -> int:
    """Packed weights plus a float32 scale and bias per group."""
    return elements * bits // 8 + 2 * 4 * (elements // group)


def _bits(quantize: str) -> int | None:
    return int(quantize) if quantize.isdigit() else MX_BITS.get(quantize)


def _nearest_bits(qtype: int) -> int:
    from gguf import GGMLQuantizationType

    match = re.search(r"\d", GGMLQuantizationType(qtype).name)
    bits = max(2, int(match.group()) if match else 8)
    return next(b for b in AFFINE_BITS if b >= bits)


def _gguf_tensors(path: Path) -> Iterator[Tensor]:
    from localradix.gguf_file import read_gguf

    for t in read_gguf(path).tensors:
        yield Tensor(t.n_elements, t.data.nbytes, t.qtype, len(t.shape) == 2)


def _safetensors(folder: Path) -> Iterator[Tensor]:
    """Every tensor of a Hugging Face folder, from the safetensors headers only."""
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            elements = 1
            for n in info["shape"]:
                elements *= n
            start, end = info["data_offsets"]
            yield Tensor(elements, end - start, None, len(info["shape"]) == 2)


def _config(folder: Path) -> dict:
    file = folder / "config.json"
    return json.loads(file.read_text()) if file.is_file() else {}
