"""Lossless verification of drafts against the target model's distributions.

A request with drafts d_1..d_k runs k+1 positions in one extend; position i's distribution p_i
is the target's next-token distribution after context + d_1..d_{i-1} (temperature, top-k/p,
min-p, penalties and grammar mask already applied for that prefix).

Rule: pick a *target token* t_i at every position exactly as the plain sampler would (argmax
when greedy, else inverse CDF of p_i at the position's uniform u_i), then accept the longest
prefix with t_i == d_i; the first t_i that differs (or t_{k+1} after the last draft) is the
correction/bonus token. This is the speculative-sampling rule for a point-mass draft:
- P(accept d_i) = P(t_i = d_i) = p_i(d_i);
- given rejection, t_i is p_i conditioned on t_i != d_i: p_i with d_i removed, renormalised;
so each emitted token has exactly the target's distribution given the tokens before it. And
since t_i is *the* token the plain sampler would draw with u_i, a seeded request (u_i depends
only on (seed, token index), `token_uniforms`) gives the same tokens with speculation on or
off, as long as both pick from p_i in the same order (the runner's sampler does both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Verdict",
    "accept",
    "accept_batch",
    "sample_targets",
    "token_uniforms",
    "verify",
    "verify_batch",
]


@dataclass(frozen=True)
class Verdict:
    """One request's outcome: drafts kept and the token the step adds after them."""

    accepted: int  # leading drafts accepted (0..k)
    token: int  # the correction (at draft `accepted`) or, if all were accepted, the bonus

    def tokens(self, drafts: np.ndarray) -> np.ndarray:
        """The tokens this step emits: accepted drafts then the correction/bonus (int64)."""
        kept = np.asarray(drafts, dtype=np.int64)[: self.accepted]
        return np.append(kept, np.int64(self.token))


def token_uniforms(seed: int, first_index: int, n: int) -> np.ndarray:
    """The draws of output tokens first_index..first_index+n-1 of a seeded request, the same
    ones the scheduler gives the plain sampler (`Scheduler._uniforms`)."""
    return np.array(
        [np.random.default_rng([seed & 0xFFFFFFFF, first_index + j]).random() for j in range(n)],
        dtype=np.float64,
    )


def sample_targets(probs: np.ndarray, uniform: np.ndarray, greedy: np.ndarray) -> np.ndarray:
    """What the plain sampler picks at each row: argmax where `greedy`, else the inverse CDF
    (in vocabulary order) of the row's uniform.

    probs: float [N, V] (need not sum to 1; zero = disallowed); uniform: float64 [N] in [0, 1);
    greedy: bool [N]. Returns int64 [N]; a zero-probability token is never picked.
    """
    probs = np.asarray(probs)
    out = probs.argmax(axis=1).astype(np.int64)
    rows = np.flatnonzero(~np.asarray(greedy, dtype=bool))
    if rows.size:
        cdf = np.cumsum(probs[rows], axis=1, dtype=np.float64)
        x = np.asarray(uniform, dtype=np.float64)[rows] * cdf[:, -1]
        picked = (cdf <= x[:, None]).sum(axis=1)  # searchsorted(cdf, x, right=True), per row
        # u * total can round up to total: stay on the last token that can be drawn.
        last = probs.shape[1] - 1 - (probs[rows, ::-1] > 0).argmax(axis=1)
        out[rows] = np.minimum(picked, last)
    return out


def accept(drafts: np.ndarray, targets: np.ndarray) -> Verdict:
    """The longest prefix of `drafts` (int [k]) equal to `targets` (int [k + 1]), and the
    target token right after it."""
    k = len(drafts)
    if len(targets) != k + 1:
        raise ValueError(f"{k} drafts need {k + 1} target tokens, got {len(targets)}")
    differs = np.flatnonzero(np.asarray(drafts) != np.asarray(targets[:k]))
    n = int(differs[0]) if differs.size else k
    return Verdict(n, int(targets[n]))


def verify(drafts: np.ndarray, probs: np.ndarray, uniform: np.ndarray, greedy: bool) -> Verdict:
    """One request: drafts int [k], probs float [k + 1, V], uniform float64 [k + 1]."""
    targets = sample_targets(probs, uniform, np.full(len(probs), greedy))
    return accept(drafts, targets)


def verify_batch(
    drafts: Sequence[np.ndarray], probs: np.ndarray, uniform: np.ndarray, greedy: np.ndarray
) -> list[Verdict]:
    """Every request of a step at once: request i's k_i + 1 rows follow request i-1's in
    `probs` (float [sum(k_i + 1), V]) and `uniform` (float64 [same]); `greedy` is per request.

    A plain decode request is simply k_i = 0: its verdict's token is the sampled token.
    """
    sizes = np.array([len(d) + 1 for d in drafts], dtype=np.int64)
    if sizes.sum() != len(probs) or len(uniform) != len(probs):
        raise ValueError(f"{sizes.sum()} rows needed, got {len(probs)} probs, {len(uniform)} draws")
    targets = sample_targets(probs, uniform, np.repeat(np.asarray(greedy, dtype=bool), sizes))
    return accept_batch(drafts, targets)


def accept_batch(drafts: Sequence[np.ndarray], targets: np.ndarray) -> list[Verdict]:
    """Verdicts from the target token of every row (what a runner's sampler returns for the
    rows of `spec.verify_rows.expand_sampling`): request i's k_i + 1 rows follow i-1's."""
    sizes = np.array([len(d) + 1 for d in drafts], dtype=np.int64)
    if sizes.sum() != len(targets):
        raise ValueError(f"{sizes.sum()} target tokens needed, got {len(targets)}")
    starts = np.cumsum(sizes) - sizes
    return [accept(d, targets[s : s + n]) for d, s, n in zip(drafts, starts, sizes)]
