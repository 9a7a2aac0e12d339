"""Building a step's plan for the runner from a batch of requests: the `ForwardBatch` (tokens,
slot tables) and the `SamplingBatch` (params, draws, penalty histories, grammar masks)."""

from __future__ import annotations

import numpy as np

from localradix.sched.request import Req, ReqState
from localradix.spec import expand_sampling, position_uniforms
from localradix.step import ForwardBatch, SamplingBatch


def forward_batch(batch: list[Req], table: np.ndarray) -> ForwardBatch:
    """Each request's new tokens and its slot-table row up to them (`table`: the
    ReqToTokenPool's). A request whose last token is still on the device is fed the runner's
    placeholder for it; one with drafts runs `[last] + drafts` and samples each position; an
    embedding request's prefill chunks are pooled."""
    ids, tables, prefixes, rows, sampled, pooling = [], [], [], [], [], []
    for req in batch:
        assert req.hold.row is not None
        end = req.hold.kv_len + req.hold.extend_len
        if req.hold.state == ReqState.PREFILL:
            ids.append(req.all_ids[req.hold.kv_len : end])
        elif req.progress.pending:
            ids.append(np.array([req.progress.placeholder], dtype=np.int64))
        else:
            ids.append(
                np.concatenate([req.progress.output_ids[-1:], req.drafts.ids]).astype(np.int64)
            )
        tables.append(table[req.hold.row, :end])
        prefixes.append(req.hold.kv_len)
        rows.append(req.hold.row)
        sampled.append(1 + len(req.drafts.ids))
        pooling.append(req.ask.embed.pooling if req.ask.embed is not None else "")
    return ForwardBatch.build(ids, tables, prefixes, rows, sampled, pooling)


def verify_sampling(batch: list[Req], rng: np.random.Generator, vocab_size: int) -> SamplingBatch:
    """`sampling_batch`, one row per sampled position when any request verifies drafts: row j
    of a request samples the token after its drafts[:j], with that token's own draw (a seeded
    request's is the one it gets without speculation) and grammar mask."""
    drafts = [r.drafts.ids for r in batch]
    if not any(len(d) for d in drafts):
        return sampling_batch(batch, rng, vocab_size)
    base = SamplingBatch.build(
        [r.ask.params for r in batch], uniforms(batch, rng), [_history(r) for r in batch]
    )
    draws = [
        position_uniforms(
            r.ask.params, len(r.progress.output_ids) + r.progress.pending, len(d) + 1, rng
        )
        if len(d)
        else base.uniform[i : i + 1]
        for i, (r, d) in enumerate(zip(batch, drafts))
    ]
    return expand_sampling(base, drafts, np.concatenate(draws), _verify_masks(batch, vocab_size))


def _verify_masks(batch: list[Req], vocab_size: int) -> np.ndarray | None:
    """Grammar rows of a verify step: the masks `draft_masks` left for each drafted request,
    a fresh row for other constrained requests that sample, all-allowed elsewhere."""
    if all(r.constraint.grammar is None for r in batch):
        return None
    sizes = [1 + len(r.drafts.ids) for r in batch]
    mask = np.full((sum(sizes), (vocab_size + 31) // 32), -1, dtype=np.int32)
    row = 0
    for req, n in zip(batch, sizes):
        spec = req.drafts.spec
        if req.constraint.grammar is not None and n > 1:
            assert spec is not None and spec.masks is not None  # left by `draft_masks`
            mask[row : row + n] = spec.masks
        elif (
            req.constraint.grammar is not None
            and req.hold.kv_len + req.hold.extend_len >= req.seq_len
        ):
            req.constraint.grammar.fill_mask(mask, row)
        row += n
    return mask


def sampling_batch(batch: list[Req], rng: np.random.Generator, vocab_size: int) -> SamplingBatch:
    return SamplingBatch.build(
        [r.ask.params for r in batch],
        uniforms(batch, rng),
        [_history(r) for r in batch],
        vocab_mask(batch, vocab_size),
    )


def uniforms(batch: list[Req], rng: np.random.Generator) -> np.ndarray:
    """One draw per request; a seeded request's draw depends only on (seed, token index)."""
    draws = rng.random(len(batch))
    for i, req in enumerate(batch):
        if req.ask.params.seed is not None:
            seq = [
                req.ask.params.seed & 0xFFFFFFFF,
                len(req.progress.output_ids) + req.progress.pending,
            ]
            draws[i] = np.random.default_rng(seq).random()
    return draws


def vocab_mask(batch: list[Req], vocab_size: int) -> np.ndarray | None:
    """Grammar bitmask rows for constrained requests that sample this step; None if none."""
    rows = [
        i
        for i, r in enumerate(batch)
        if r.constraint.grammar is not None and r.hold.kv_len + r.hold.extend_len >= r.seq_len
    ]
    if not rows:
        return None
    mask = np.full((len(batch), (vocab_size + 31) // 32), -1, dtype=np.int32)
    for i in rows:
        grammar = batch[i].constraint.grammar
        assert grammar is not None
        grammar.fill_mask(mask, i)
    return mask


def penalized(req: Req) -> bool:
    p = req.ask.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0 or p.frequency_penalty != 0


def _history(req: Req) -> tuple[np.ndarray, int] | None:
    """The tokens a penalty counts (prompt and output) and where the output starts."""
    return (req.all_ids, len(req.ask.prompt_ids)) if penalized(req) else None
