"""Building a step's plan for the runner from a batch of requests: the `ForwardBatch` (tokens,
slot tables) and the `SamplingBatch` (params, draws, penalty histories, grammar masks)."""

from __future__ import annotations

import numpy as np

from localradix.sched.request import Req, ReqState
from localradix.step import ForwardBatch, SamplingBatch


def forward_batch(batch: list[Req], table: np.ndarray) -> ForwardBatch:
    """Each request's new tokens and its slot-table row up to them (`table`: the
    ReqToTokenPool's). A request whose last token is still on the device is fed the runner's
    placeholder for it."""
    ids, tables, prefixes, rows = [], [], [], []
    for req in batch:
        assert req.row is not None
        end = req.kv_len + req.extend_len
        if req.state == ReqState.PREFILL:
            ids.append(req.all_ids[req.kv_len : end])
        elif req.pending:
            ids.append(np.array([req.placeholder], dtype=np.int64))
        else:
            ids.append(np.array(req.output_ids[-1:], dtype=np.int64))
        tables.append(table[req.row, :end])
        prefixes.append(req.kv_len)
        rows.append(req.row)
    return ForwardBatch.build(ids, tables, prefixes, rows)


def sampling_batch(batch: list[Req], rng: np.random.Generator, vocab_size: int) -> SamplingBatch:
    return SamplingBatch.build(
        [r.params for r in batch],
        uniforms(batch, rng),
        [_history(r) for r in batch],
        vocab_mask(batch, vocab_size),
    )


def uniforms(batch: list[Req], rng: np.random.Generator) -> np.ndarray:
    """One draw per request; a seeded request's draw depends only on (seed, token index)."""
    draws = rng.random(len(batch))
    for i, req in enumerate(batch):
        if req.params.seed is not None:
            seq = [req.params.seed & 0xFFFFFFFF, len(req.output_ids) + req.pending]
            draws[i] = np.random.default_rng(seq).random()
    return draws


def vocab_mask(batch: list[Req], vocab_size: int) -> np.ndarray | None:
    """Grammar bitmask rows for constrained requests that sample this step; None if none."""
    rows = [
        i
        for i, r in enumerate(batch)
        if r.grammar is not None and r.kv_len + r.extend_len >= r.seq_len
    ]
    if not rows:
        return None
    mask = np.full((len(batch), (vocab_size + 31) // 32), -1, dtype=np.int32)
    for i in rows:
        batch[i].grammar.fill_mask(mask, i)
    return mask


def penalized(req: Req) -> bool:
    p = req.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0 or p.frequency_penalty != 0


def _history(req: Req) -> tuple[np.ndarray, int] | None:
    """The tokens a penalty counts (prompt and output) and where the output starts."""
    return (req.all_ids, len(req.prompt_ids)) if penalized(req) else None
