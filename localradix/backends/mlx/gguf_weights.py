"""GGUF tensors as MLX weights, read tensor by tensor from the memory-mapped file.

Q4_0, Q4_1 and Q8_0 blocks (32 weights, one float16 scale `d`) are repacked bit for bit into
MLX's affine group-32 format (w = scale * q + bias): Q4_1 is d * q + m, so scale = d and
bias = m; Q4_0 is d * (q - 8), so bias = -8 d; Q8_0 is d * q with q signed, so MLX's unsigned
q + 128 takes bias = -128 d. Other quantized types (K-quants, IQ, Q5_x) have no MLX twin: they
are dequantized and re-quantized to the nearest MLX affine width, with a logged notice, or
kept float16 with `--quantize off`. Float tensors stay as they are.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np

from localradix.backends.mlx.quant import AFFINE_BITS, Quantized, QuantSpec, quantize
from localradix.gguf_file import GGUFTensor, read_gguf
from localradix.loader.gguf_metadata import hf_tensor_name, qk_heads, unpermute_qk

logger = logging.getLogger("localradix.runner")

GROUP = 32  # every GGML block type MLX can hold has 32 weights per scale
F32, F16, Q4_0, Q4_1, Q8_0 = 0, 1, 2, 3, 8  # gguf.GGMLQuantizationType values
FLOATS = {F32, F16, 28, 30}  # and F64, BF16
NATIVE_BITS = {Q4_0: 4, Q4_1: 4, Q8_0: 8}

Weight = mx.array | Quantized
# GGUF architectures whose tensors map to MLX's names as they are (no expert stacking, fused
# weights or converter transformations to undo: those are the torch loader's `gguf_tensors`).
PLAIN_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


def load_gguf_weights(path: Path, quantize_to: str = "auto") -> dict[str, Weight]:
    """{HF parameter name: float array or Quantized}; Q/K rows un-permuted as on torch.

    quantize_to: "auto" (re-quantize the types MLX cannot hold to the nearest width), "off"
    (dequantize those to float16), or a `--quantize` choice (re-quantize them to that).
    """
    gguf = read_gguf(path)
    arch = gguf.metadata.get("general.architecture")
    experts = any("_exps." in t.name for t in gguf.tensors)
    if arch not in PLAIN_ARCHITECTURES or experts:
        what = f"{arch} GGUFs" + (" with experts" if experts else "")
        raise ValueError(
            f"the MLX backend loads GGUFs of {', '.join(PLAIN_ARCHITECTURES)} only, not {what}: "
            "serve it with --backend cpu (or a GPU backend) or --backend llamacpp"
        )
    out: dict[str, Weight] = {}
    requantized: Counter[str] = Counter()
    for t in gguf.tensors:
        name = hf_tensor_name(t.name)
        if name is None:
            continue
        heads = qk_heads(gguf.metadata, name)
        if t.qtype in NATIVE_BITS:
            out[name] = _repacked(t, heads)
            continue
        array = _float(t)
        if heads is not None:
            array = unpermute_qk(array, heads)
        if t.qtype in FLOATS or array.ndim != 2:
            out[name] = mx.array(array)  # as stored (the model casts it to its dtype)
            continue
        if quantize_to == "off":
            out[name] = mx.array(array.astype(np.float16))
            continue
        spec = nearest_spec(t.qtype) if quantize_to == "auto" else QuantSpec.parse(quantize_to)
        out[name] = packed = quantize(mx.array(array), spec, mx.float32)
        mx.eval(packed.arrays())  # one float tensor alive at a time
        requantized[f"{_type_name(t.qtype)} -> {spec.mode} {spec.bits}-bit"] += 1
    if requantized:
        done = ", ".join(f"{n} x {what}" for what, n in sorted(requantized.items()))
        logger.info(
            "GGUF tensors MLX cannot hold as stored were re-quantized (%s, group %s); "
            "--quantize off keeps them float16",
            done,
            GROUP,
        )
    return out


def nearest_spec(qtype: int) -> QuantSpec:
    """The MLX affine group-32 format closest to a GGML type: its nominal bits, rounded up."""
    match = re.search(r"\d", _type_name(qtype))
    bits = max(2, int(match.group()) if match else 8)
    return QuantSpec(GROUP, next(b for b in AFFINE_BITS if b >= bits))


def _repacked(t: GGUFTensor, heads: int | None) -> Quantized:
    """A Q4_0 / Q4_1 / Q8_0 tensor as MLX's (uint32 weight, scales, biases), exactly."""
    rows = t.data.shape[0]
    blocks = t.data.reshape(rows, -1, t.data.shape[1] // (t.shape[-1] // GROUP))
    d = _f16(blocks[..., 0:2])
    if t.qtype == Q8_0:
        q = (blocks[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        packed = q.reshape(rows, -1).view("<u4")
        biases = -128 * d
    else:
        qs = blocks[..., 4:20] if t.qtype == Q4_1 else blocks[..., 2:18]
        # GGML keeps weight j in the low nibble of byte j and weight j + 16 in the high one;
        # MLX packs weight i at bits 4 i of its uint32 words (two per byte, low nibble first).
        nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, -1, 2)
        packed = (nibbles[..., 0] | (nibbles[..., 1] << 4)).astype(np.uint8).view("<u4")
        biases = _f16(blocks[..., 2:4]) if t.qtype == Q4_1 else -8 * d
    arrays = [np.ascontiguousarray(packed), d, biases]
    if heads is not None:  # llama.cpp permuted the rows; each row's groups stay intact
        arrays = [unpermute_qk(a, heads) for a in arrays]
    weight, scales, bias = (mx.array(a) for a in arrays)
    return Quantized(weight, scales, bias, QuantSpec(GROUP, NATIVE_BITS[t.qtype]), mx.float32)


def _f16(two_bytes: np.ndarray) -> np.ndarray:
    """float32 [rows, blocks] from each block's little-endian float16 field."""
    return np.ascontiguousarray(two_bytes).view("<f2")[..., 0].astype(np.float32)


def _float(t: GGUFTensor) -> np.ndarray:
    if t.qtype == F32:
        return t.data.view("<f4").reshape(t.shape)
    if t.qtype == F16:
        return t.data.view("<f2").reshape(t.shape)
    return t.dequantize()  # float32


def _type_name(qtype: int) -> str:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(qtype).name
