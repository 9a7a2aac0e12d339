"""What a verify step costs, learnt online, and the draft length that pays for itself.

A step's time is fitted as `t ≈ c0 + c1·rows + c2·attention`: c0 the per-step overhead (host
scheduling, launch, reading back), c1 each sampled row's matmuls and sampler, c2 each row's
attention per 1k tokens of context it reads. A verify step of a request with k drafts adds k
rows of its context, so over the plain decode step of its batch (time T) it costs
`T·(1 + β·k)` with `β = (c1 + c2·L) / T`. On a GPU c0 dominates (β ≈ 0.01, drafts are nearly
free); on a busy CPU c1 does (β → 1, a verify of k drafts costs nearly k decode steps).

With a per-draft acceptance α, k drafts yield `(1 − α^(k+1)) / (1 − α)` tokens in expectation
(the accepted run plus the token after it), so the best k maximises that per unit of cost and
is 0 — plain decode — when no k beats one token per step: drafts are never a net loss.

The fit is least squares over exponentially forgotten steps, the per-row costs ridged towards
the prior β (so a direction the recent steps never varied, e.g. rows while nobody drafts,
falls back to the prior instead of drifting, and one odd verify step does not decide alone). Times are in units of the first step's, so the ridge is scale-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["CostConfig", "StepCostModel", "best_draft_len", "expected_tokens"]


@dataclass(frozen=True)
class CostConfig:
    beta_prior: float = 0.3  # a draft row's cost over a decode step's, before any verify step
    ridge: float = 2.0  # weight of the prior, in steps: one odd verify step is not the truth
    forget: float = 0.98  # per observed step: the fit follows load and context within ~50 steps
    outlier: float = 2.5  # a step slower than this × its prediction counts as this × (preempted)

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta_prior or self.ridge <= 0 or not 0.0 < self.forget <= 1.0:
            raise ValueError(f"need beta_prior >= 0, ridge > 0, 0 < forget <= 1, got {self}")


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a step emits in expectation with k drafts each accepted with probability α
    (given the ones before it were): 1 + α + … + α^k."""
    return float(sum(alpha**j for j in range(k + 1)))


def best_draft_len(alpha: float, beta: float, k_max: int) -> int:
    """The k in 0..k_max with the most expected tokens per unit of step cost `1 + β·k`
    (ties: the shorter); 0 when no k beats plain decode."""
    best_k, best = 0, 1.0
    for k in range(1, k_max + 1):
        rate = expected_tokens(alpha, k) / (1.0 + beta * k)
        if rate > best * (1.0 + 1e-9):
            best_k, best = k, rate
    return best_k


@dataclass
class StepCostModel:
    """Online fit of decode/verify step times (one per scheduler, i.e. per runner)."""

    config: CostConfig = field(default_factory=CostConfig)
    _unit: float = 0.0  # seconds of the first observed step: the fit's time unit
    _xx: np.ndarray = field(default_factory=lambda: np.zeros((3, 3)))
    _xt: np.ndarray = field(default_factory=lambda: np.zeros(3))
    _prior: np.ndarray = field(default_factory=lambda: np.zeros(3))
    _theta: np.ndarray | None = None  # (c0, c1, c2) in units of `_unit`
    observed: int = 0

    @staticmethod
    def features(rows: int, attention: float) -> np.ndarray:
        """`rows` sampled positions whose contexts sum to `attention` tokens."""
        return np.array([1.0, float(rows), attention / 1000.0])

    def observe(self, rows: int, attention: float, seconds: float) -> None:
        """A decode or verify step ran `rows` positions over `attention` context tokens."""
        if seconds <= 0 or rows <= 0:
            return
        x = self.features(rows, attention)
        if not self._unit:
            self._unit = seconds
            self._prior = self._prior_for(rows)
        t = seconds / self._unit
        if self._theta is not None:  # a preempted step says nothing about the model's cost
            t = min(t, self.config.outlier * max(float(x @ self._theta), 1e-9))
        f = self.config.forget
        self._xx = f * self._xx + np.outer(x, x)
        self._xt = f * self._xt + x * t
        self.observed += 1
        self._theta = self._solve()

    def _solve(self) -> np.ndarray:
        """Ridge least squares with no negative cost: a coefficient the fit makes negative
        (noise, or context and rows moving together) is held at 0 and the rest refitted."""
        # Every step observes c0 (its feature is 1): only the per-row costs lean on the prior.
        ridge = self.config.ridge * np.array([1e-6, 1.0, 1.0])
        a = self._xx + np.diag(ridge)
        b = self._xt + ridge * self._prior
        free = np.ones(3, dtype=bool)
        theta = np.zeros(3)
        while free.any():
            theta[:] = 0.0
            theta[free] = np.linalg.solve(a[np.ix_(free, free)], b[free])
            if (theta >= 0).all():
                break
            free &= theta > 0
        return theta

    def _prior_for(self, rows: int) -> np.ndarray:
        """The first step took 1 time unit: a draft row costs `beta_prior` of it, the rest
        is per-step overhead, and context is free until steps say otherwise."""
        c1 = self.config.beta_prior
        return np.array([max(1.0 - c1 * rows, 0.0), c1, 0.0])

    def beta(self, batch_rows: int, batch_attention: float, context: int) -> float:
        """A draft row's cost (context `context`) over the plain decode step of a batch of
        `batch_rows` requests reading `batch_attention` context tokens in all."""
        if self._theta is None:
            return self.config.beta_prior
        _, c1, c2 = self._theta
        step = float(self.features(batch_rows, batch_attention) @ self._theta)
        return float((c1 + c2 * context / 1000.0) / max(step, 1e-9))

    @property
    def coefficients(self) -> tuple[float, float, float]:
        """(c0, c1, c2) in seconds (c2 per 1k context tokens), for logs and benchmarks."""
        if self._theta is None:
            return (0.0, 0.0, 0.0)
        c0, c1, c2 = (float(c) * self._unit for c in self._theta)
        return (c0, c1, c2)
