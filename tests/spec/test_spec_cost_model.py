"""The verify cost model: the fit recovers synthetic step costs, and the chosen draft length is
the one with the most expected tokens per unit of cost (0 when drafts cannot pay)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from localradix.spec import (
    AdaptiveConfig,
    AdaptiveK,
    CostConfig,
    StepCostModel,
    best_draft_len,
    expected_tokens,
)


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_best_k_by_hand():
    # alpha 0.9, beta 0.3: tokens/cost for k = 1..6 is 1.46, 1.69, 1.81, 1.86, 1.88, 1.86
    assert best_draft_len(0.9, 0.3, 8) == 5
    assert best_draft_len(0.9, 0.3, 3) == 3  # capped
    assert best_draft_len(0.99, 0.01, 8) == 8  # drafts nearly free (a GPU): all of them
    assert best_draft_len(0.5, 0.0, 8) == 8  # free drafts always help a little


def test_no_draft_when_a_draft_row_costs_a_decode_step():
    # beta = 1: k drafts cost k + 1 steps and yield fewer than k + 1 tokens unless alpha = 1
    for alpha in (0.1, 0.5, 0.9, 0.99):
        assert best_draft_len(alpha, 1.0, 8) == 0
    assert best_draft_len(0.3, 0.5, 8) == 0  # free chat on a CPU
    assert best_draft_len(0.0, 0.01, 8) == 0  # drafts that are never accepted
    assert best_draft_len(0.9, 0.3, 0) == 0  # speculation off for the request


@given(st.floats(0.0, 0.999), st.floats(0.0, 2.0), st.integers(0, 12))
def test_best_k_beats_every_other_k_and_plain_decode(alpha: float, beta: float, k_max: int):
    k = best_draft_len(alpha, beta, k_max)
    assert 0 <= k <= k_max
    best = expected_tokens(alpha, k) / (1 + beta * k)
    assert best >= 1.0  # never a net loss against plain decode
    for other in range(k_max + 1):
        assert best >= expected_tokens(alpha, other) / (1 + beta * other) - 1e-9


def synthetic_steps(
    c0: float, c1: float, c2: float, contexts: list[int], ks: list[int], noise: float = 0.0
) -> list[tuple[int, float, float]]:
    """(rows, context read, seconds) of single-stream steps with the given true costs."""
    rng = np.random.default_rng(0)
    steps = []
    for ctx, k in zip(contexts, ks):
        rows, attention = 1 + k, (1 + k) * ctx
        seconds = c0 + c1 * rows + c2 * attention / 1000
        steps.append((rows, attention, seconds * (1 + noise * rng.standard_normal())))
    return steps


def fitted(steps: list[tuple[int, float, float]], config: CostConfig | None = None):
    model = StepCostModel(config or CostConfig())
    for rows, attention, seconds in steps:
        model.observe(rows, attention, seconds)
    return model


def test_the_fit_recovers_synthetic_costs():
    # llama.cpp on this box: 12 ms a step, 4.5 ms per row and 1k context (attention)
    c0, c1, c2 = 0.010, 0.002, 0.0045
    rng = np.random.default_rng(1)
    contexts = list(rng.integers(200, 5000, 300))
    ks = list(rng.integers(0, 9, 300))
    model = fitted(synthetic_steps(c0, c1, c2, contexts, ks, noise=0.02))
    assert model.coefficients == pytest.approx((c0, c1, c2), rel=0.15, abs=5e-4)
    # at 4k context a decode step takes 30 ms and a draft row 20 ms: beta ~ 0.67
    beta = model.beta(1, 4000, 4000)
    assert beta == pytest.approx((c1 + 4 * c2) / (c0 + c1 + 4 * c2), rel=0.1)
    assert best_draft_len(0.6, beta, 8) == 0  # long context on this CPU: plain decode
    assert best_draft_len(0.8, model.beta(1, 200, 200), 8) > 2  # short context: drafts pay


def test_large_beta_gives_plain_decode_and_small_beta_long_drafts():
    slow = fitted(synthetic_steps(0.001, 0.02, 0.0, [500] * 100, [0, 4, 8, 2] * 25))
    assert slow.beta(1, 500, 500) > 0.9
    assert best_draft_len(0.9, slow.beta(1, 500, 500), 8) == 0
    fast = fitted(synthetic_steps(0.02, 0.0002, 0.0, [500] * 100, [0, 4, 8, 2] * 25))
    assert fast.beta(1, 500, 500) < 0.05
    assert best_draft_len(0.8, fast.beta(1, 500, 500), 8) == 8


def test_prior_before_any_step_and_where_steps_never_varied():
    model = StepCostModel(CostConfig(beta_prior=0.3))
    assert model.beta(1, 100, 100) == 0.3
    for _ in range(200):  # plain decode only: the draft row's cost is never observed alone
        model.observe(1, 100, 0.01)
    assert model.beta(1, 100, 100) == pytest.approx(0.3, abs=0.05)


def test_a_preempted_step_barely_moves_the_fit():
    steps = synthetic_steps(0.01, 0.002, 0.0, [500] * 200, [0, 3, 6, 8] * 50)
    clean = fitted(steps)
    rows, attention, seconds = steps[-1]
    noisy = fitted(steps[:-1] + [(rows, attention, 100 * seconds)])
    assert noisy.beta(1, 500, 500) == pytest.approx(clean.beta(1, 500, 500), rel=0.5)


def test_the_fit_follows_a_change_of_load():
    before = synthetic_steps(0.02, 0.001, 0.0, [500] * 200, [0, 4, 8, 2] * 50)
    after = synthetic_steps(0.002, 0.02, 0.0, [500] * 200, [0, 4, 8, 2] * 50)
    model = fitted(before + after)
    assert model.beta(1, 500, 500) > 0.8


def test_nonsense_steps_are_ignored():
    model = StepCostModel()
    model.observe(0, 0, 1.0)
    model.observe(1, 10, 0.0)
    assert model.observed == 0 and model.beta(1, 10, 10) == CostConfig().beta_prior


def test_config_is_checked():
    with pytest.raises(ValueError):
        CostConfig(forget=0.0)
    with pytest.raises(ValueError):
        CostConfig(ridge=0.0)


def test_acceptance_estimate_is_the_geometric_one():
    ak = AdaptiveK(AdaptiveConfig(k_max=8, k_start=8, window=4))
    assert ak.alpha == 0.5  # no verdict yet
    ak.record(8, 8)  # 8 accepted, no rejection
    assert ak.alpha == pytest.approx(9 / 10)
    ak.record(8, 2)  # 2 accepted, then a rejection
    assert ak.alpha == pytest.approx(11 / 13)
    for _ in range(4):  # the window forgets the old steps
        ak.record(1, 0)
    assert ak.alpha == pytest.approx(1 / 6)


def test_drafts_not_run_are_scored_against_the_tokens_that_follow():
    from localradix.sched.speculation import RequestSpec
    from localradix.spec import NgramConfig, NgramDrafter

    spec = RequestSpec(NgramDrafter(NgramConfig(), [1, 2, 3]), AdaptiveK(AdaptiveConfig()))
    spec.shadow = np.array([5, 6, 7])
    spec.score_shadow([5])
    spec.score_shadow([6, 9])  # 2 agreed, then one differed: decided
    assert not len(spec.shadow) and spec.adaptive.alpha == pytest.approx((2 + 1) / (2 + 1 + 2))
    spec.shadow = np.array([4, 4])
    spec.score_shadow([4, 4, 8])  # all agreed
    assert spec.adaptive.alpha == pytest.approx((4 + 1) / (4 + 1 + 2))
    assert spec.adaptive.counters.steps == 0  # nothing was verified: /metrics unchanged
