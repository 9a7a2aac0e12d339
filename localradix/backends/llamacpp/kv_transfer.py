"""LlamaKVTransfer: llama.cpp's KV cells to host bytes and back, for the cache tiers.

llama.cpp addresses KV by (sequence, position), and reads or writes it only as a sequence's
state blob. A spare sequence id (`scratch`, outside the SeqMap) carries the cells across:
- out: `scratch` is tagged onto the cells of the slots (one cached path), its blob is read
  and parsed into token rows, and `scratch` is emptied (the cells stay: others tag them);
- in: the rows become a blob at the positions after the cached prefix, loaded as `scratch`'s
  only cells, then handed to a new ghost sequence that also tags the prefix (`SeqMap.adopt`),
  exactly as if that sequence had computed them.
A hybrid model's blob (flags 0) is the attention part, then the recurrent part; `scratch`'s
recurrent part is always the empty state's (`LlamaStates.kept` detaches it around every cell
edit), so `tail` (that empty part) is cut off a blob read and appended to one written: loading
it leaves `scratch` no state. The request's state comes back on its own (`LlamaStates.adopt`).
A pure recurrent model has no cells (`layout` None): its rows are empty, and only the map moves.
A sliding-window model's blob holds its sliding-window layers' cells only within the window
of the sequence's last position, so a path goes out `window` positions at a time (each group
within one window); the runner learns the layout from a one-token blob llama.cpp writes itself
(`CellLayout.learn`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from localradix.backends.llamacpp.cell_blob import BlobError, CellLayout
from localradix.backends.llamacpp.seq_map import SeqMap
from localradix.mem.kv_tiers import KVUnavailable


class LlamaKVTransfer:
    def __init__(
        self,
        llama: Any,
        ctx: Any,
        seqs: SeqMap,
        scratch: int,
        layout: CellLayout | None,
        tail: bytes = b"",
        window: int = 0,
    ):
        self.llama, self.ctx, self.seqs, self.scratch = llama, ctx, seqs, scratch
        self.window = window
        self.layout, self.tail = layout, np.frombuffer(tail, dtype=np.uint8)
        self.bytes_per_token = layout.bytes_per_token if layout is not None else 0

    def read(self, slots: np.ndarray) -> np.ndarray:
        slots = np.asarray(slots, dtype=np.int64)
        if self.layout is None:  # no cells: the map alone says which slots hold tokens
            if (self.seqs.slot_pos[slots] < 0).any():
                raise KVUnavailable("exporting slots that hold no cell")
            return np.zeros((len(slots), 0), dtype=np.uint8)
        if not self.window:
            return self._read(slots)
        group = self.seqs.slot_pos[slots] // self.window  # positions sharing one window
        cuts = np.flatnonzero(np.diff(group)) + 1
        return np.concatenate([self._read(part) for part in np.split(slots, cuts)])

    def _read(self, slots: np.ndarray) -> np.ndarray:
        assert self.layout is not None
        blob = self.seqs.export(slots, self.scratch, self._save)
        if len(self.tail) and bytes(blob[len(blob) - len(self.tail) :]) != self.tail.tobytes():
            raise KVUnavailable("the spare sequence kept a recurrent state")
        blob = blob[: len(blob) - len(self.tail)]
        try:  # a blob we cannot read loses those tokens' tiers, never the engine
            layout, positions, rows = CellLayout.parse(blob, self.layout.ext)
        except BlobError as exc:
            raise KVUnavailable(f"llama.cpp's KV state does not parse: {exc}") from exc
        if layout != self.layout:
            raise KVUnavailable("llama.cpp's KV layout changed since the probe")
        wanted = self.seqs.slot_pos[slots]
        order = np.argsort(positions)
        at = order[np.searchsorted(positions, wanted, sorter=order)]
        if not np.array_equal(positions[at], wanted):
            raise KVUnavailable("llama.cpp's blob lacks some of the cells asked for")
        return rows[at]

    def write(self, prefix: np.ndarray, slots: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        if self.layout is None:
            self.seqs.adopt(np.asarray(prefix, np.int64), slots, self.scratch, lambda s: None)
            return
        positions = np.arange(len(prefix), len(prefix) + len(slots), dtype=np.int64)
        blob = self.layout.build(positions, parts, seq=self.scratch)  # no concatenated copy
        if len(self.tail):  # (one copy of the blob: a hybrid's own state loads apart)
            blob = np.concatenate([blob, self.tail])
        self.seqs.adopt(
            np.asarray(prefix, np.int64), slots, self.scratch, lambda s: self._load(s, blob)
        )

    def _save(self, seq: int) -> memoryview:
        return save_state(self.llama, self.ctx, seq)

    def _load(self, seq: int, blob: np.ndarray) -> None:
        pointer = blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))  # no copy
        if not self.llama.llama_state_seq_set_data(self.ctx, pointer, blob.size, seq):
            raise RuntimeError(f"llama.cpp could not load {blob.size} bytes of KV into {seq}")


def save_state(llama: Any, ctx: Any, seq: int) -> memoryview:
    size = int(llama.llama_state_seq_get_size(ctx, seq))
    buffer = (ctypes.c_uint8 * size)()
    got = int(llama.llama_state_seq_get_data(ctx, buffer, size, seq))
    if got != size:
        raise RuntimeError(f"llama.cpp wrote {got} of {size} state bytes of sequence {seq}")
    return memoryview(buffer).cast("B")  # no copy: the view keeps the buffer alive
