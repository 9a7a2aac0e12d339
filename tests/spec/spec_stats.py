"""Chi-square goodness of fit without scipy: the statistic and its upper tail probability."""

from __future__ import annotations

import math

import numpy as np


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """(statistic, degrees of freedom) of observed `counts` against expected `probs`; cells
    expected below 5 are pooled into one (the usual validity rule)."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    expected = np.asarray(probs, dtype=np.float64).ravel() * counts.sum()
    small = expected < 5
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
        if expected[-1] == 0:
            if counts[-1] > 0:
                return math.inf, len(counts) - 2
            counts, expected = counts[:-1], expected[:-1]
    stat = float(((counts - expected) ** 2 / expected).sum())
    return stat, len(counts) - 1


def chi_square_sf(stat: float, dof: int) -> float:
    """P(X >= stat) for X ~ chi-square(dof): the regularized upper incomplete gamma Q(dof/2,
    stat/2), by its series below a + 1 and its continued fraction above (Numerical Recipes)."""
    if math.isinf(stat):
        return 0.0
    a, x = dof / 2.0, stat / 2.0
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h
