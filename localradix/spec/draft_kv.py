"""KV bookkeeping of a verify step: which of a request's slots its rejected drafts give back.

A verify step of a request with `kv_len` computed tokens writes k + 1 positions: its last
token x at `kv_len`, then d_1..d_k. After a verdict of `a` accepted drafts, positions
[0, kv_len + 1 + a) hold the KV of real tokens (x, d_1..d_a) and [kv_len + 1 + a,
kv_len + 1 + k) hold KV of rejected drafts. The request gives back at once every whole page
past the one it still writes into; freeing them through the pool also drops llama.cpp's cells
(the pool's free listener, `ModelRunner.bind_kv`). What stays behind in the open page is
overwritten by the next step before any attention reads it (a request reads `seq_len` slots).
The radix tree only ever receives `all_ids[:kv_len]`, and output_ids only holds verified
tokens, so it never stores a rejected draft.
"""

from __future__ import annotations

import numpy as np

__all__ = ["kept_kv_len", "rejected_slots"]


def kept_kv_len(kv_len: int, accepted: int) -> int:
    """Tokens with valid KV after a verify step that started at `kv_len`: x and the accepted
    drafts (the correction/bonus token is the next step's input, with no KV yet)."""
    return kv_len + 1 + accepted


def rejected_slots(row: np.ndarray, kept: int, written: int, page_size: int = 1) -> np.ndarray:
    """The slots to free from a request's slot-table `row` when only `kept` of the `written`
    positions hold real tokens: whole pages from the one after position `kept - 1` up to the
    end of the page holding `written - 1` (what `Scheduler._reserve` reserved)."""
    if not 0 <= kept <= written:
        raise ValueError(f"kept {kept} of {written} written positions")
    start = -(-kept // page_size) * page_size
    end = -(-written // page_size) * page_size
    return np.asarray(row[start:end], dtype=np.int64).copy()
