"""The rows of a verify step: one sampling row per position, so the runner's own sampler picks
each position's target token exactly as a plain decode step would have.

Request i with k_i drafts runs k_i + 1 positions; row j (0..k_i) samples the token after
context + drafts[:j]. So row j repeats the request's parameters, takes the draw of output
token index `first + j` (seeded requests: the same draw as without speculation), counts
penalties over history + drafts[:j], and masks with the grammar's state after drafts[:j].
`spec.verify.accept_batch` then turns the sampled rows into verdicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from localradix.sampling_params import SamplingParams
from localradix.spec.verify import token_uniforms
from localradix.step import SamplingBatch

__all__ = ["RollbackGrammar", "draft_masks", "expand_sampling", "position_uniforms"]


class RollbackGrammar(Protocol):
    """A grammar state that can try drafts and step back (xgrammar's matcher can)."""

    def fill_mask(self, mask: np.ndarray, row: int) -> None: ...
    def accept(self, token: int) -> bool: ...
    def rollback(self, n: int) -> None: ...


def position_uniforms(
    params: SamplingParams, first_index: int, n: int, rng: np.random.Generator
) -> np.ndarray:
    """Draws for output tokens first_index..first_index+n-1: from (seed, token index) for a
    seeded request, as `Scheduler._uniforms` does one at a time, else fresh from `rng`."""
    if params.seed is None:
        return rng.random(n)
    return token_uniforms(params.seed, first_index, n)


def draft_masks(grammar: RollbackGrammar, drafts: np.ndarray, mask: np.ndarray, row: int) -> int:
    """Fill `mask[row + j]` with the allowed tokens after drafts[:j], for j = 0..m, where m is
    how many leading drafts the grammar allows; return m and leave the grammar as it was.

    A draft the grammar refuses has probability 0, so it and every draft after it would be
    rejected: the caller drops them (and the positions they would cost) before launching.
    A draft that ends the grammar is dropped too (there is no state after it to mask from).
    """
    grammar.fill_mask(mask, row)
    taken = 0
    for token in drafts:
        if not grammar.accept(int(token)):
            break
        if getattr(grammar, "terminated", False):  # a stop token: no mask after it exists
            grammar.rollback(1)  # left to the row before it, which may still pick it
            break
        taken += 1
        grammar.fill_mask(mask, row + taken)
    if taken:
        grammar.rollback(taken)
    return taken


def expand_sampling(
    base: SamplingBatch,
    drafts: Sequence[np.ndarray],
    uniform: np.ndarray,
    vocab_mask: np.ndarray | None = None,
) -> SamplingBatch:
    """`base` (row i = request i) widened to one row per verify position: request i's
    len(drafts[i]) + 1 rows follow request i-1's. `uniform` and `vocab_mask` are already per
    row (`position_uniforms`, `draft_masks`); histories grow by the drafts before each row."""
    sizes = np.array([len(d) + 1 for d in drafts], dtype=np.int64)
    if len(sizes) != base.size or len(uniform) != sizes.sum():
        raise ValueError(f"{base.size} requests, {len(sizes)} draft lists, {len(uniform)} draws")

    def rows(col: np.ndarray) -> np.ndarray:
        return np.repeat(col, sizes)

    return SamplingBatch(
        temperature=rows(base.temperature),
        top_p=rows(base.top_p),
        top_k=rows(base.top_k),
        min_p=rows(base.min_p),
        uniform=np.asarray(uniform, dtype=np.float64),
        repetition_penalty=rows(base.repetition_penalty),
        presence_penalty=rows(base.presence_penalty),
        frequency_penalty=rows(base.frequency_penalty),
        history=tuple(h for hist, d in zip(base.history, drafts) for h in _histories(hist, d)),
        logprobs=rows(base.logprobs),
        vocab_mask=vocab_mask,
    )


def _histories(
    hist: tuple[np.ndarray, int] | None, drafts: np.ndarray
) -> list[tuple[np.ndarray, int] | None]:
    if hist is None:
        return [None] * (len(drafts) + 1)
    ids, n_prompt = hist
    seen = np.concatenate([np.asarray(ids, dtype=np.int64), np.asarray(drafts, dtype=np.int64)])
    return [(seen[: len(ids) + j], n_prompt) for j in range(len(drafts) + 1)]
