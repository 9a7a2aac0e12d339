"""Adaptive draft length: bounded, grows on full acceptance, shrinks on rejection, turns off."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localradix.spec import AdaptiveConfig, AdaptiveK, SpecCounters


def test_grows_on_full_acceptance_up_to_k_max():
    ak = AdaptiveK(AdaptiveConfig(k_max=8, k_start=2))
    ks = []
    for _ in range(4):
        ak.record(ak.draft_len, ak.draft_len)
        ks.append(ak.k)
    assert ks == [4, 8, 8, 8]


def test_shrinks_to_what_would_have_been_accepted_plus_one():
    ak = AdaptiveK(AdaptiveConfig(k_max=8, k_start=8))
    ak.record(8, 2)
    assert ak.k == 3
    ak.record(3, 0)
    assert ak.k == 1
    ak.record(1, 0)
    assert ak.k == 1  # never below 1
    ak.record(1, 1)
    assert ak.k == 2


def test_steps_without_a_draft_are_not_counted():
    ak = AdaptiveK()
    ak.record(0, 0)
    assert ak.counters.steps == 0 and ak.k == AdaptiveConfig().k_start


@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), max_size=60))
def test_k_stays_in_bounds(outcomes: list[tuple[int, int]]):
    ak = AdaptiveK(AdaptiveConfig(k_max=6, k_start=3, window=4))
    for drafted, accepted in outcomes:
        drafted = min(drafted, ak.k)
        ak.record(drafted, min(accepted, drafted))
        assert 1 <= ak.k <= 6
        assert ak.draft_len == (ak.k if ak.enabled else 0)


def test_off_after_a_window_of_low_acceptance_only():
    cfg = AdaptiveConfig(k_max=4, k_start=4, window=4, min_acceptance=0.25)
    ak = AdaptiveK(cfg)
    for _ in range(3):
        ak.record(4, 0)
    assert ak.enabled  # the window is not full yet
    ak.record(1, 0)
    assert not ak.enabled and ak.draft_len == 0

    good = AdaptiveK(cfg)
    for drafted, accepted in ((4, 0), (1, 1), (2, 2), (4, 0), (1, 0)):
        assert good.k == drafted
        good.record(drafted, accepted)
        assert good.enabled  # 3 of 11, then 3 of 8 drafts accepted: above 25 %
    assert good.window_rate == pytest.approx(3 / 8)


def test_counters():
    c = SpecCounters()
    c.add(4, 4)
    c.add(4, 1)
    assert (c.steps, c.drafted, c.accepted, c.emitted) == (2, 8, 5, 7)
    assert c.acceptance_rate == pytest.approx(5 / 8)
    assert c.tokens_per_step == pytest.approx(3.5)
    total = SpecCounters()
    total.merge(c)
    total.merge(c)
    assert (total.steps, total.emitted) == (4, 14)
    with pytest.raises(ValueError):
        c.add(2, 3)
    assert SpecCounters().acceptance_rate == 0.0 and SpecCounters().tokens_per_step == 0.0


def test_config_is_validated():
    with pytest.raises(ValueError):
        AdaptiveConfig(k_max=2, k_start=3)
    with pytest.raises(ValueError):
        AdaptiveConfig(min_acceptance=1.5)
