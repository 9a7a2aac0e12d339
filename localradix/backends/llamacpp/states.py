"""LlamaStates: snapshots of the recurrent state of llama.cpp's hybrid and recurrent models.

Qwen3.5/3.6, Granite 4 hybrids, LFM2, Mamba, RWKV: beside (or instead of) attention cells,
each sequence carries one recurrent state that has folded in every token so far. llama.cpp
cannot cut it back to a prefix: a partial `seq_rm` fails, and `seq_cp` replaces the
destination's state with the source's. What it can do is save and load one sequence's state
(`llama_state_seq_*_ext` with PARTIAL_ONLY: the recurrent part alone, not the attention cells,
which the unified cache shares by tagging as for any model). So:
- a snapshot is the PARTIAL_ONLY blob of a request's sequence, taken when the scheduler asks
  (`save`), and handed to the radix cache as an int handle;
- a request resuming on a cached path gets its blob loaded into its sequence right before its
  first step (`restore`), after its attention cells were tagged in;
- every edit of a sequence's attention cells runs inside `kept(seq)`: the state is set aside
  (loading an empty blob detaches it, so llama.cpp lets the cells go), then put back, so
  cache bookkeeping never changes what a running request computes.
Loading a state costs a copy of it (kilobytes for tiny models, a few MB for real ones), paid
per cache event, never per token. For the cache tiers (`StateTransfer`), a snapshot travels as
its blob's bytes (`export`) and comes back as a new snapshot (`adopt`), checked to be a state
of one cell at the position its name says, so a stale or foreign blob is a miss, not a crash.
"""

from __future__ import annotations

import ctypes
import itertools
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from localradix.backends.llamacpp.seq_map import SeqMap

Blob = Any  # a ctypes c_uint8 array holding one sequence's PARTIAL_ONLY state
SPARE_BLOBS = 8


class LlamaStates:
    def __init__(self, llama: Any, ctx: Any, seqs: SeqMap, budget: int):
        self.llama, self.ctx, self.seqs = llama, ctx, seqs  # seqs: which row holds which id
        self.flags = llama.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        self.budget = budget
        self._blobs: dict[int, Blob] = {}
        self._ids = itertools.count(1)
        self._pending: dict[int, Blob | None] = {}  # row -> state its next step starts from
        # Released blobs, reused: a fresh 19 MiB buffer costs 5-50 ms of page faults to fill.
        self._spare: list[Blob] = []
        self.empty = self._read(0)  # no sequence has run yet: the state of no tokens

    # ---- StateSnapshots --------------------------------------------------------------------

    def save(self, row: int) -> tuple[int, int]:
        seq = self.seqs.seq_of_row.get(row)
        if seq is None:
            raise RuntimeError(f"request row {row} has no llama.cpp sequence to snapshot")
        blob = self._read(seq)
        handle = next(self._ids)
        self._blobs[handle] = blob
        return handle, len(blob)

    def restore(self, row: int, handle: int | None) -> None:
        # The blob itself, not the handle: the cache may drop the handle before the step runs.
        self._pending[row] = None if handle is None else self._blobs[handle]

    def release(self, handle: int) -> None:
        blob = self._blobs.pop(handle)
        if len(self._spare) < SPARE_BLOBS and not any(b is blob for b in self._pending.values()):
            self._spare.append(blob)

    @property
    def live(self) -> int:
        return len(self._blobs)

    # ---- StateTransfer (the cache tiers below the tree) ---------------------------------------

    def export(self, handle: int) -> np.ndarray:
        """uint8 [bytes]: the snapshot's blob (a copy: the blob's buffer is reused)."""
        return np.frombuffer(self._blobs[handle], dtype=np.uint8).copy()

    def adopt(self, data: np.ndarray, tokens: int) -> tuple[int, int]:
        """A snapshot of the blob `export` gave, after `tokens` tokens: (handle, bytes)."""
        # magic, sequence id, then the recurrent part: one cell at position tokens - 1
        head = bytes(data[:20])
        if len(head) < 20 or head[:4] != bytes(self.empty[:4]):
            raise ValueError(f"a state of {len(data)} bytes is not llama.cpp's for this model")
        cells, pos = struct.unpack_from("<Ii", head, 8)
        if (cells, pos) != (1, tokens - 1):
            raise ValueError(f"a state at position {pos} ({cells} cells) named as after {tokens}")
        blob = self._buffer(len(data))
        ctypes.memmove(blob, np.ascontiguousarray(data, dtype=np.uint8).ctypes.data, len(data))
        handle = next(self._ids)
        self._blobs[handle] = blob
        return handle, len(blob)

    # ---- what the runner calls --------------------------------------------------------------

    def apply_pending(self, row: int, seq: int, prefix_len: int) -> None:
        """Load the state a newly placed request resumes from into its sequence, which must
        then hold exactly `prefix_len` tokens (cells and state alike)."""
        if row not in self._pending:
            return
        blob = self._pending.pop(row)
        self._write(seq, self.empty if blob is None else blob)
        held = int(self.llama.llama_memory_seq_pos_max(self.llama.llama_get_memory(self.ctx), seq))
        if held != prefix_len - 1:
            raise RuntimeError(
                f"sequence {seq} resumes after {held + 1} tokens, its request after {prefix_len}"
            )

    @contextmanager
    def kept(self, seq: int) -> Iterator[None]:
        """Edit `seq`'s attention cells without changing its recurrent state (see above)."""
        # -1: no request row holds it (or the tiers' spare sequence, outside the map)
        row = int(self.seqs.row_of[seq]) if seq < self.seqs.n_seq else -1
        live = row >= 0 and row not in self._pending  # a ghost's or a to-be-restored state: moot
        saved = self._read(seq) if live else None
        self._write(seq, self.empty)
        try:
            yield
        finally:
            self._write(seq, self.empty if saved is None else saved)
            if saved is not None and len(self._spare) < SPARE_BLOBS:
                self._spare.append(saved)

    def clear(self, seq: int) -> None:
        """Detach `seq`'s recurrent state (its attention cells stay)."""
        self._write(seq, self.empty)

    # ---- llama.cpp ---------------------------------------------------------------------------

    def _read(self, seq: int) -> Blob:
        size = int(self.llama.llama_state_seq_get_size_ext(self.ctx, seq, self.flags))
        blob = self._buffer(size)
        got = int(self.llama.llama_state_seq_get_data_ext(self.ctx, blob, size, seq, self.flags))
        if got != size:
            raise RuntimeError(f"llama.cpp wrote {got} of {size} state bytes of sequence {seq}")
        return blob

    def _buffer(self, size: int) -> Blob:
        for i, blob in enumerate(self._spare):
            if len(blob) == size:
                return self._spare.pop(i)
        return (ctypes.c_uint8 * size)()

    def _write(self, seq: int, blob: Blob) -> None:
        read = int(
            self.llama.llama_state_seq_set_data_ext(self.ctx, blob, len(blob), seq, self.flags)
        )
        if read == 0:
            raise RuntimeError(f"llama.cpp could not load a saved state into sequence {seq}")
