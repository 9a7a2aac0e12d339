"""A `llama_batch` whose arrays are numpy buffers, so a step fills it with vector writes.

`llama_batch_init` allocates one seq-id array per token; here every token's seq-id pointer
points into one int32 buffer, so the sequence of each token is set with one numpy assignment.
Each token carries its request's sequence id (requests never share a token in a batch), and,
with `twin_offset`, that sequence's twin too (`swa_twins.py`).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


class LlamaBatch:
    def __init__(self, llama: Any, capacity: int, twin_offset: int = 0) -> None:
        self.capacity = capacity
        self.twin_offset = twin_offset
        width = 2 if twin_offset else 1
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.positions = np.zeros(capacity, dtype=np.int32)
        self.seq_ids = np.zeros((capacity, width), dtype=np.int32)
        self.n_seq_id = np.full(capacity, width, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        seq_type = ctypes.POINTER(llama.llama_seq_id)
        base = self.seq_ids.ctypes.data
        self._seq_ptrs = (seq_type * capacity)(
            *(ctypes.cast(base + 4 * width * i, seq_type) for i in range(capacity))
        )
        self.struct = llama.llama_batch(
            n_tokens=0,
            token=self.tokens.ctypes.data_as(ctypes.POINTER(llama.llama_token)),
            embd=None,
            pos=self.positions.ctypes.data_as(ctypes.POINTER(llama.llama_pos)),
            n_seq_id=self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(seq_type)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def fill(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        seq_ids: np.ndarray,
        outputs: np.ndarray,
        twinned: bool = True,
    ) -> None:
        """Set the batch to these tokens; `outputs` indexes the tokens whose logits are read
        (`twinned` False: the tokens name their sequence alone, a spare one without a twin)."""
        n = len(tokens)
        if n > self.capacity:
            raise ValueError(f"a step of {n} tokens exceeds the batch capacity {self.capacity}")
        self.tokens[:n] = tokens
        self.positions[:n] = positions
        self.seq_ids[:n, 0] = seq_ids
        self.n_seq_id[:n] = 2 if self.twin_offset and twinned else 1
        if self.twin_offset:
            self.seq_ids[:n, 1] = seq_ids + self.twin_offset
        self.logits[:n] = 0
        self.logits[outputs] = 1
        self.struct.n_tokens = n
