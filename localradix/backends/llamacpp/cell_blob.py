"""llama.cpp's per-sequence KV state blob, read into token rows and written back.

`llama_state_seq_get_data` of one sequence of a plain (unified, non-SWA) KV cache is: llama.cpp's
state magic and the sequence id, the stream count (1), the cell count n, per cell its position, a
sequence count (1), the cell's extension when the model has one (M-RoPE's 2D position and the
token id: `ext` bytes) and that sequence id, then `v_trans` and the layer count, every layer's K
type, row size and n rows, and every layer's V likewise (or, with `v_trans`, its type, element
size and width followed by the n cells' elements of each V column). A hybrid model's blob holds
this attention part first, its recurrent part after (stripped by the caller). A sliding-window
model's blob holds two such parts after the head, from the stream count on: its full-attention
layers' cells, then its sliding-window layers' (the same positions: `then`). The cache tiers
store KV token by token, so a cell becomes one row: its extension, its K of every layer, then
its V of every layer (then the second part's K and V). The layout (types, row sizes, extension) is learned once from a blob
llama.cpp wrote itself (`CellLayout.learn`), never assumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

EXT_BYTES = (0, 12)  # sizes of llama_kv_cell_ext a cell may carry: none, or (x, y, token)
PART_HEAD = 16  # a KV part's stream count, cell count, v_trans and layer count


def cell_meta(ext: int) -> np.dtype:
    return np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("ext", "u1", (ext,)), ("seq", "<i4")])


class BlobError(ValueError):
    """A blob that is not a one-stream, one-sequence plain KV state."""


@dataclass(frozen=True)
class CellLayout:
    magic: int  # what llama.cpp checks at the head of a blob it loads
    v_trans: bool
    k_types: tuple[int, ...]
    k_rows: tuple[int, ...]  # bytes of one cell's K, per layer
    v_types: tuple[int, ...]
    v_rows: tuple[int, ...]  # bytes of one cell's V, per layer
    v_elems: tuple[tuple[int, int], ...] = ()  # (element size, width) per layer with v_trans
    ext: int = 0  # bytes of each cell's extension (M-RoPE position, token id), kept in its row
    then: CellLayout | None = None  # the sliding-window layers' part, where the model has one

    @property
    def bytes_per_token(self) -> int:
        return self.ext + self.kv_bytes + (self.then.kv_bytes if self.then else 0)

    @property
    def kv_bytes(self) -> int:
        """One cell's K and V bytes in this part."""
        return sum(self.k_rows) + sum(self.v_rows)

    @classmethod
    def learn(cls, blob: bytes | memoryview) -> CellLayout:
        """The layout of a blob llama.cpp wrote: whether its cells carry an extension is not
        in the blob, so each size is tried; only the right one parses to the end."""
        errors = []
        for ext in EXT_BYTES:
            try:
                return cls.parse(blob, ext)[0]
            except BlobError as exc:
                errors.append(str(exc))
        raise BlobError(" / ".join(errors))

    @classmethod
    def parse(
        cls, blob: bytes | memoryview, ext: int = 0
    ) -> tuple[CellLayout, np.ndarray, np.ndarray]:
        """(layout, positions int32 [n], rows uint8 [n, bytes_per_token]) of a blob whose
        cells carry `ext` bytes of extension."""
        reader = _Reader(blob)
        magic, seq = reader.u32(), reader.i32()
        layout, meta, parts = cls._part(reader, magic, seq, ext)
        if reader.left >= PART_HEAD:  # a sliding-window part: the same cells, its own layers
            then, then_meta, more = cls._part(reader, magic, seq, ext)
            if not np.array_equal(then_meta, meta):
                raise BlobError("the sliding-window part holds other cells than the full part")
            layout = replace(layout, then=then)
            parts = parts + more[1:]
        if not reader.done:
            raise BlobError(f"{reader.left} bytes past the end of the KV state")
        return layout, meta["pos"].astype(np.int64), np.concatenate(parts, axis=1)

    @classmethod
    def _part(
        cls, reader: _Reader, magic: int, seq: int, ext: int
    ) -> tuple[CellLayout, np.ndarray, list[np.ndarray]]:
        """One KV cache's part of a blob: (its layout, its cells' meta, [ext, K..., V...])."""
        if reader.u32() != 1:
            raise BlobError("more than one KV stream (a non-unified cache)")
        n = reader.u32()
        meta = reader.array(cell_meta(ext), n)
        if n and ((meta["n_seq"] != 1).any() or (meta["seq"] != seq).any()):
            raise BlobError("cells of several sequences")
        v_trans, layers = reader.u32(), reader.u32()
        k_types, k_rows, parts = [], [], [meta["ext"]]
        for _ in range(layers):
            k_types.append(reader.i32())
            k_rows.append(reader.u64())
            parts.append(reader.array(np.uint8, n * k_rows[-1]).reshape(n, k_rows[-1]))
        v_types, v_rows, v_elems = [], [], []
        for _ in range(layers):
            v_types.append(reader.i32())
            if v_trans:
                size, width = reader.u32(), reader.u32()
                v_elems.append((size, width))
                v_rows.append(size * width)
                columns = reader.array(np.uint8, width * n * size).reshape(width, n, size)
                parts.append(columns.transpose(1, 0, 2).reshape(n, width * size))
            else:
                v_rows.append(reader.u64())
                parts.append(reader.array(np.uint8, n * v_rows[-1]).reshape(n, v_rows[-1]))
        layout = cls(
            magic, bool(v_trans), tuple(k_types), tuple(k_rows), tuple(v_types), tuple(v_rows),
            tuple(v_elems), ext,
        )  # fmt: skip
        return layout, meta, parts

    def build(
        self, positions: np.ndarray, rows: np.ndarray | Sequence[np.ndarray], seq: int = 0
    ) -> np.ndarray:
        """The blob (uint8) of cells at `positions` holding `rows` (what `parse` returns, or
        consecutive parts of it), written in place: per layer, one strided copy per part."""
        parts = [rows] if isinstance(rows, np.ndarray) else list(rows)
        meta = np.zeros(len(positions), dtype=cell_meta(self.ext))
        meta["pos"], meta["n_seq"], meta["seq"] = positions, 1, seq
        if self.ext:
            meta["ext"] = np.concatenate([part[:, : self.ext] for part in parts])
        layouts = [self] if self.then is None else [self, self.then]
        size = 8 + sum(part._size(meta) for part in layouts)
        writer = _Writer(np.empty(size, dtype=np.uint8))
        writer.put(_u32(self.magic), _i32(seq))
        col = self.ext
        for part in layouts:
            col = part._write(writer, meta, parts, col)
        assert writer.pos == size
        return writer.out

    def _size(self, meta: np.ndarray) -> int:
        return 16 + meta.nbytes + 12 * 2 * len(self.k_rows) + len(meta) * self.kv_bytes

    def _write(self, writer: _Writer, meta: np.ndarray, parts: list[np.ndarray], col: int) -> int:
        """This part's cells, K and V (from byte `col` of each row on); the column after."""
        writer.put(_u32(1), _u32(len(meta)), meta.tobytes())
        writer.put(_u32(int(self.v_trans)), _u32(len(self.k_rows)))
        for k_type, width in zip(self.k_types, self.k_rows):
            writer.put(_i32(k_type), _u64(width))
            writer.rows(parts, col, width)
            col += width
        for i, (v_type, width) in enumerate(zip(self.v_types, self.v_rows)):
            if self.v_trans:
                item, elems = self.v_elems[i]
                writer.put(_i32(v_type), _u32(item), _u32(elems))
                writer.columns(parts, col, elems, item)
            else:
                writer.put(_i32(v_type), _u64(width))
                writer.rows(parts, col, width)
            col += width
        return col


class _Writer:
    def __init__(self, out: np.ndarray) -> None:
        self.out, self.pos = out, 0

    def put(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self.out[self.pos : self.pos + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
            self.pos += len(chunk)

    def rows(self, parts: list[np.ndarray], col: int, width: int) -> None:
        """Bytes [col, col + width) of every token, token after token."""
        for part in parts:
            end = self.pos + len(part) * width
            self.out[self.pos : end].reshape(len(part), width)[...] = part[:, col : col + width]
            self.pos = end

    def columns(self, parts: list[np.ndarray], col: int, elems: int, item: int) -> None:
        """A transposed V block: element j of every token, then element j + 1, ..."""
        n = sum(len(part) for part in parts)
        block = self.out[self.pos : self.pos + n * elems * item].reshape(elems, n, item)
        first = 0
        for part in parts:
            values = part[:, col : col + elems * item].reshape(len(part), elems, item)
            block[:, first : first + len(part)] = values.transpose(1, 0, 2)
            first += len(part)
        self.pos += n * elems * item


class _Reader:
    def __init__(self, blob: bytes | memoryview) -> None:
        self.buf = memoryview(blob).cast("B")
        self.pos = 0

    def array(self, dtype: np.dtype | type | str, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        end = self.pos + dt.itemsize * count
        if end > len(self.buf):
            raise BlobError("the KV state ends early")
        out = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
        self.pos = end
        return out

    def u32(self) -> int:
        return int(self.array("<u4", 1)[0])

    def i32(self) -> int:
        return int(self.array("<i4", 1)[0])

    def u64(self) -> int:
        return int(self.array("<u8", 1)[0])

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    @property
    def done(self) -> bool:
        return self.pos == len(self.buf)


def _u32(v: int) -> bytes:
    return int(v).to_bytes(4, "little")


def _i32(v: int) -> bytes:
    return int(v).to_bytes(4, "little", signed=True)


def _u64(v: int) -> bytes:
    return int(v).to_bytes(8, "little")
