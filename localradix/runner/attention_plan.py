"""One step's attention plan in numpy, shared by the torch-native and the MLX attention.

Both backends read a `ForwardBatch` the same way: decode requests (one new token each) as
batched groups over a padded [B, L] slot table, where requests that share a cached prefix
attend to it once ("cascade"); each extend (prefill) request on its own, with a causal mask
shifted by its cached prefix. `plan_attention` decides all of that once per step; a backend
only turns the arrays into its own (torch tensors on its device, MLX arrays). Numpy only.

A sliding window (`window` > 0: a query at position p sees keys p - window < j <= p) trims
each decode request's slot table to its last `window` slots and each extend request's keys to
those its first query sees, with a banded mask. Every slot stays in the cache; only reads skip.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from localradix.step import ForwardBatch

# A decode group shares its prefix only from this many tokens: below it, gathering per request
# costs less than the extra kernels.
MIN_SHARED_PREFIX = 64


@dataclass(frozen=True)
class SharedPrefix:
    """Leading slots that several decode requests of one group have in common."""

    rows: np.ndarray  # [b] rows of the group (b >= 2) whose slot tables start with `slots`
    slots: np.ndarray  # [L] the prefix's slots
    run: slice | None  # `slots` as a slice when they are one ascending run (a view, no gather)


@dataclass(frozen=True)
class DecodeGroup:
    """Decode requests attended in one batched call."""

    token_rows: np.ndarray  # [B] rows of q (the step's new tokens) that are these requests'
    all_rows: bool  # the group is every row of q, in order: no gather needed
    run: slice | None  # one request on contiguous slots: its slots as a slice (slots unused)
    slots: np.ndarray  # [B, L] padded slot table (after the shared prefixes); padding = slot 0
    valid: np.ndarray | None  # bool [B, L]: True = a real slot; None = no padding
    shared: tuple[SharedPrefix, ...] = ()


@dataclass(frozen=True)
class ExtendPlan:
    """One extend request: its rows of q, and its keys when it has a cached prefix."""

    start: int  # first row of this request's new tokens in q
    end: int
    slots: np.ndarray | None  # [S] slots of prefix + new tokens; None = no prefix (use k/v)
    causal: np.ndarray | None  # bool [E, S] causal mask offset by the prefix; None = no prefix
    # `slots` as a slice when they are one ascending run: a view, no gather. A verify step is
    # an extend of k + 1 tokens over a long prefix: gathering its K/V doubled its attention.
    run: slice | None = None
    # The mask is banded by a sliding window (not only causal): kernels that assume a causal
    # mask over the last E keys must use `causal` instead.
    windowed: bool = False


@dataclass(frozen=True)
class AttentionPlan:
    decodes: tuple[DecodeGroup, ...]
    extends: tuple[ExtendPlan, ...]


def plan_attention(
    batch: ForwardBatch,
    gather_tokens: int | None = None,
    min_shared_prefix: int = MIN_SHARED_PREFIX,
    window: int = 0,
) -> AttentionPlan:
    """The plan of `batch`. `gather_tokens`: most K/V tokens one decode call may gather (a
    bigger decode batch is split in groups of whole requests); None = one group. `window`:
    a sliding window (0 = none)."""
    is_decode = batch.extend_lens == 1
    reqs = np.flatnonzero(is_decode)
    decodes = (
        _plan_decodes(batch, reqs, gather_tokens, min_shared_prefix, window) if len(reqs) else ()
    )
    extends = tuple(plan_extend(batch, int(i), window) for i in np.flatnonzero(~is_decode))
    return AttentionPlan(decodes, extends)


def _plan_decodes(
    batch: ForwardBatch, reqs: np.ndarray, gather_tokens: int | None, minimum: int, window: int
) -> tuple[DecodeGroup, ...]:
    width = int(batch.seq_lens[reqs].max())
    if window:
        width = min(width, window)
    size = len(reqs) if gather_tokens is None else max(1, gather_tokens // width)
    if size >= len(reqs):
        whole = len(reqs) == batch.num_reqs  # decode-only: q rows are the requests
        return (plan_decode(batch, reqs, whole, minimum, window),)
    chunks = [reqs[i : i + size] for i in range(0, len(reqs), size)]
    return tuple(plan_decode(batch, chunk, False, minimum, window) for chunk in chunks)


def plan_decode(
    batch: ForwardBatch,
    reqs: np.ndarray,
    all_rows: bool,
    minimum: int = MIN_SHARED_PREFIX,
    window: int = 0,
) -> DecodeGroup:
    """One decode group of requests `reqs` (rows of the batch); with a `window`, each sees
    only its last `window` slots."""
    token_rows = batch.qo_indptr[reqs]
    lens = batch.seq_lens[reqs]
    starts = batch.kv_indptr[reqs]
    if window:
        cut = np.maximum(lens - window, 0)
        # A slot holds one position of one sequence, so equal trimmed slots still mean a
        # shared prefix (same positions): the grouping below stays exact.
        starts, lens = starts + cut, lens - cut
    empty = np.zeros((0, 0), dtype=np.int64)
    if len(reqs) == 1:
        run = contiguous_run(batch.kv_indices[starts[0] : starts[0] + lens[0]])
        if run is not None:
            return DecodeGroup(token_rows, all_rows, run, empty, None)
    skip, groups = shared_prefix_groups(batch.kv_indices, starts, lens, minimum)
    shared = tuple(SharedPrefix(rows, prefix, contiguous_run(prefix)) for rows, prefix in groups)
    starts, lens = starts + skip, lens - skip
    cols = np.arange(int(lens.max()), dtype=np.int64)
    valid = cols[None, :] < lens[:, None]
    flat = np.minimum(starts[:, None] + cols[None, :], len(batch.kv_indices) - 1)
    slots = np.where(valid, batch.kv_indices[flat], 0)  # padding reads the dummy slot 0
    return DecodeGroup(token_rows, all_rows, None, slots, None if valid.all() else valid, shared)


def plan_extend(batch: ForwardBatch, req: int, window: int = 0) -> ExtendPlan:
    start, end = int(batch.qo_indptr[req]), int(batch.qo_indptr[req + 1])
    prefix = int(batch.prefix_lens[req])
    kv = batch.kv_indices[batch.kv_indptr[req] : batch.kv_indptr[req + 1]]
    if window and len(kv) > window:  # some query sees fewer keys than it would causally
        first = max(0, prefix - window + 1)  # the first query's oldest visible key
        keys = np.arange(first, len(kv))[None, :]  # positions of the kept keys
        queries = prefix + np.arange(end - start)[:, None]
        band = (keys <= queries) & (keys > queries - window)
        kept = kv[first:]
        return ExtendPlan(start, end, kept, band, contiguous_run(kept), windowed=True)
    if prefix == 0:
        return ExtendPlan(start, end, None, None)
    causal = np.arange(len(kv))[None, :] <= prefix + np.arange(end - start)[:, None]
    return ExtendPlan(start, end, kv, causal, contiguous_run(kv))


def shared_prefix_groups(
    kv_indices: np.ndarray, starts: np.ndarray, lens: np.ndarray, minimum: int
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Decode requests (slot tables `kv_indices[starts[i] : starts[i] + lens[i]]`) that share
    at least `minimum` leading slots: (slots each leaves to its group, [(rows, prefix slots)]).

    A slot holds one token of one sequence, so two requests with the same slot at position p
    share every slot before it: grouping by the slot at `minimum - 1` is exact. Each request
    keeps at least its newest slot for itself.
    """
    skip = np.zeros(len(starts), dtype=np.int64)
    groups: list[tuple[np.ndarray, np.ndarray]] = []
    long_enough = np.flatnonzero(lens > minimum)
    marks = kv_indices[starts[long_enough] + minimum - 1]
    _, group_of, sizes = np.unique(marks, return_inverse=True, return_counts=True)
    for g in np.flatnonzero(sizes >= 2):
        rows = long_enough[group_of == g]
        span = int(lens[rows].min()) - 1
        tables = kv_indices[starts[rows, None] + np.arange(span)]
        same = np.all(tables == tables[0], axis=0)
        common = span if same.all() else int(np.argmin(same))
        skip[rows] = common
        groups.append((rows, tables[0, :common]))
    return skip, groups


def contiguous_run(slots: np.ndarray) -> slice | None:
    """The slots as a slice when they are one ascending run (a view, no gather), else None."""
    if len(slots) and np.all(np.diff(slots) == 1):
        return slice(int(slots[0]), int(slots[-1]) + 1)
    return None
