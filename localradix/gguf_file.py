"""A minimal GGUF (v2/v3, little-endian) reader: metadata and memory-mapped tensor bytes.

`gguf.GGUFReader` builds numpy views for every element of every metadata array, which takes
seconds for a 50k-token vocabulary; this reads the same header in a fraction of that and hands
raw tensor bytes to `gguf.quants.dequantize`. Pass `tensors=False` to stop after the metadata.
A split model (llama.cpp's `NAME-00001-of-00003.gguf` shards, `split.*` keys) is read whole from
its first shard: metadata from that shard, tensors from all of them.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_SCALARS = {  # GGUF value type -> struct format
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}  # fmt: skip
_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}  # fmt: skip
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # numpy order (GGUF lists dimensions fastest-first)
    qtype: int  # gguf.GGMLQuantizationType value
    data: np.ndarray  # uint8 [rows, bytes per row], memory-mapped

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    def dequantize(self) -> np.ndarray:
        """float32 array of `shape`."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        return dequantize(self.data, GGMLQuantizationType(self.qtype)).reshape(self.shape)


@dataclass(frozen=True)
class GGUFFile:
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buffer: memoryview) -> None:
        self.buf, self.pos = buffer, 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("Q")
        self.pos += length
        return bytes(self.buf[self.pos - length : self.pos]).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.scalar("I"), self.scalar("Q")
            if item_type in _NUMPY:  # numbers: one vectorised read
                dtype = np.dtype(_NUMPY[item_type])
                items = np.frombuffer(self.buf, dtype, count, self.pos)
                self.pos += count * dtype.itemsize
                return items.tolist()
            return [self.value(item_type) for _ in range(count)]
        if vtype not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.scalar(_SCALARS[vtype])


SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def read_gguf(path: str | Path, tensors: bool = True) -> GGUFFile:
    """The file's metadata and (unless `tensors` is False) its tensors; given a split model's
    first shard, the tensors of every shard."""
    first = read_gguf_file(path, tensors)
    count = int(first.metadata.get("split.count", 1) or 1)
    if not tensors or count <= 1 or int(first.metadata.get("split.no", 0)) != 0:
        return first
    rest = [read_gguf_file(p).tensors for p in shard_paths(Path(path), count)[1:]]
    return GGUFFile(first.metadata, [t for part in (first.tensors, *rest) for t in part])


def shard_paths(first: Path, count: int) -> list[Path]:
    """A split model's shards, in order, from its first shard's path."""
    match = SHARD_NAME.match(first.name)
    if match is None or int(match["no"]) != 1 or int(match["count"]) != count:
        raise ValueError(
            f"{first.name} is the first of {count} GGUF shards but is not named "
            "NAME-00001-of-000NN.gguf, so its other shards cannot be found"
        )
    paths = [
        first.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)
    ]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise ValueError(
            f"{first.name} is split in {count}; missing shard(s): {', '.join(missing)}"
        )
    return paths


def read_gguf_file(path: str | Path, tensors: bool = True) -> GGUFFile:
    """One GGUF file as it is (one shard of a split model holds only its own tensors)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(data))  # type: ignore[arg-type]  # a memmap is a buffer
    if bytes(cur.buf[:4]) != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file")
    cur.pos = 4
    version = cur.scalar("I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (need 2 or 3)")
    n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
    metadata = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("I"))
    if not tensors:
        return GGUFFile(metadata, [])
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar("Q") for _ in range(cur.scalar("I"))]
        infos.append((name, dims, cur.scalar("I"), cur.scalar("Q")))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cur.pos // alignment) * alignment
    return GGUFFile(metadata, [_tensor(data, start, *info) for info in infos])


def _tensor(
    data: np.ndarray, start: int, name: str, dims: list[int], qtype: int, offset: int
) -> GGUFTensor:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    row_bytes = dims[0] // block * type_size
    rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
    begin = start + offset
    raw = data[begin : begin + rows * row_bytes].reshape(rows, row_bytes)
    return GGUFTensor(name, tuple(reversed(dims)), qtype, raw)
