"""Verification: greedy equals a one-token-at-a-time greedy loop, seeded sampling equals the
plain sampler token for token, and the sampled distribution is the target's (chi-square, with
negative controls that a wrong rejection step fails)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spec_stats import chi_square, chi_square_sf
from spec_toys import ToyModel

from localradix.spec import (
    NgramConfig,
    NgramDrafter,
    Verdict,
    accept,
    sample_targets,
    token_uniforms,
    verify,
    verify_batch,
)

V = 5
PROMPT = [0, 1, 2, 0, 1]

# ---- the target token and the accepted prefix ------------------------------------------------


def test_inverse_cdf_never_picks_a_zero_probability_token():
    probs = np.array([[0.0, 0.5, 0.0, 0.5, 0.0]] * 5)
    u = np.array([0.0, 0.49, 0.5, 0.99, np.nextafter(1.0, 0.0)])
    assert sample_targets(probs, u, np.zeros(5, bool)).tolist() == [1, 1, 3, 3, 3]
    assert sample_targets(probs, u, np.ones(5, bool)).tolist() == [1] * 5  # argmax: first max


def test_targets_match_the_runners_sampler():
    torch = pytest.importorskip("torch")
    from localradix.runner.sampler import sample
    from localradix.sampling_params import SamplingParams
    from localradix.step import SamplingBatch

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(64, 11)).astype(np.float32)
    u = rng.random(64)
    params = [SamplingParams(temperature=0.0 if i % 4 == 0 else 1.0) for i in range(64)]
    batch = SamplingBatch.build(params, u, [None] * 64)
    theirs = sample(torch.from_numpy(logits), batch).token_ids
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    ours = sample_targets(probs, u, batch.temperature == 0)
    assert ours.tolist() == theirs.tolist()


def test_accept_takes_the_longest_matching_prefix():
    assert accept(np.array([3, 4, 5]), np.array([3, 4, 9, 7])) == Verdict(2, 9)
    assert accept(np.array([3, 4, 5]), np.array([3, 4, 5, 7])) == Verdict(3, 7)
    assert accept(np.array([3]), np.array([1, 7])) == Verdict(0, 1)
    assert accept(np.zeros(0, np.int64), np.array([6])) == Verdict(0, 6)
    assert Verdict(2, 9).tokens(np.array([3, 4, 5])).tolist() == [3, 4, 9]
    with pytest.raises(ValueError):
        accept(np.array([1, 2]), np.array([1, 2]))


def test_token_uniforms_are_the_schedulers_draws():
    seq = [7 & 0xFFFFFFFF, 12]
    assert token_uniforms(7, 12, 3)[0] == np.random.default_rng(seq).random()
    assert token_uniforms(7, 10, 4)[2:].tolist() == token_uniforms(7, 12, 2).tolist()


# ---- speculation against a plain loop on a toy model ----------------------------------------

Drafts = Callable[[list[int], np.random.Generator], list[int]]


def random_drafts(ctx: list[int], rng: np.random.Generator) -> list[int]:
    return rng.integers(0, V, size=rng.integers(0, 6)).tolist()


def worst_drafts(model: ToyModel) -> Drafts:
    """Always the least likely token (often a disallowed one) along the draft's own path."""

    def draft(ctx: list[int], rng: np.random.Generator) -> list[int]:
        out: list[int] = []
        for _ in range(4):
            out.append(int(model.probs(ctx + out).argmin()))
        return out

    return draft


def oracle_drafts(model: ToyModel) -> Drafts:
    """The greedy continuation itself: every draft accepted under greedy."""

    def draft(ctx: list[int], rng: np.random.Generator) -> list[int]:
        out: list[int] = []
        for _ in range(int(rng.integers(1, 7))):
            out.append(int(model.probs(ctx + out).argmax()))
        return out

    return draft


def ngram_drafts(ctx: list[int], rng: np.random.Generator) -> list[int]:
    return NgramDrafter(NgramConfig(min_match=2), ctx).propose(5).tokens.tolist()


def plain(model: ToyModel, n: int, greedy: bool, seed: int) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        probs = model.probs(PROMPT + out)[None]
        u = token_uniforms(seed, len(out), 1)
        out.append(int(sample_targets(probs, u, np.array([greedy]))[0]))
    return out


def speculative(model: ToyModel, n: int, greedy: bool, seed: int, drafts: Drafts) -> list[int]:
    rng = np.random.default_rng(seed + 1)
    out: list[int] = []
    while len(out) < n:
        ctx = PROMPT + out
        d = drafts(ctx, rng)
        verdict = verify(
            np.array(d, np.int64),
            model.rows(ctx, d),
            token_uniforms(seed, len(out), len(d) + 1),
            greedy,
        )
        assert 0 <= verdict.accepted <= len(d)
        out += verdict.tokens(np.array(d, np.int64)).tolist()
    return out[:n]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.integers(0, 2**31), st.booleans())
def test_speculation_equals_the_plain_loop(kind: int, seed: int, greedy: bool):
    """Greedy: token-identical to a one-token-at-a-time greedy loop. Seeded sampling: the same,
    since each position uses the draw of its token index (whatever the drafts were)."""
    model = ToyModel(V, seed=seed % 97)
    drafts = [random_drafts, worst_drafts(model), oracle_drafts(model), ngram_drafts][kind]
    assert speculative(model, 40, greedy, seed, drafts) == plain(model, 40, greedy, seed)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=8), st.integers(0, 2**31))
def test_batch_verify_equals_one_request_at_a_time(sizes: list[int], seed: int):
    rng = np.random.default_rng(seed)
    drafts = [rng.integers(0, V, size=k) for k in sizes]
    rows = sum(k + 1 for k in sizes)
    probs = rng.random((rows, V)) * (rng.random((rows, V)) > 0.3)
    probs[:, 0] += 1e-3  # every row has some mass
    u, greedy = rng.random(rows), rng.random(len(sizes)) < 0.5
    got = verify_batch(drafts, probs, u, greedy)
    start = 0
    for d, g, verdict in zip(drafts, greedy, got):
        end = start + len(d) + 1
        assert verdict == verify(d, probs[start:end], u[start:end], bool(g))
        start = end
    if sizes:
        with pytest.raises(ValueError):
            verify_batch(drafts, probs[:-1], u[:-1], greedy)


# ---- the distribution: chi-square over many seeded draws ------------------------------------

Verifier = Callable[[np.ndarray, np.ndarray, np.random.Generator], Verdict]


def lossless(drafts: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> Verdict:
    return verify(drafts, probs, rng.random(len(probs)), greedy=False)


def textbook(drafts: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> Verdict:
    """The rule as usually written: accept d with probability p(d), else sample the residual
    (p with d removed, renormalised). An independent implementation, also lossless."""
    return _accept_or_resample(drafts, probs, rng, accept_prob=lambda p: p, remove_draft=True)


def resample_full(drafts: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> Verdict:
    """WRONG: on rejection, sample from p without removing the draft (biased towards it)."""
    return _accept_or_resample(drafts, probs, rng, accept_prob=lambda p: p, remove_draft=False)


def accept_too_often(drafts: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> Verdict:
    """WRONG: accept with probability sqrt(p(d)) (too often), residual otherwise."""
    return _accept_or_resample(drafts, probs, rng, accept_prob=np.sqrt, remove_draft=True)


def _accept_or_resample(drafts, probs, rng, accept_prob, remove_draft) -> Verdict:
    probs = probs / probs.sum(axis=1, keepdims=True)
    for i, d in enumerate(drafts):
        if rng.random() < accept_prob(probs[i, d]):
            continue
        residual = probs[i].copy()
        if remove_draft:
            residual[d] = 0.0
        return Verdict(i, int(rng.choice(len(residual), p=residual / residual.sum())))
    return Verdict(len(drafts), int(rng.choice(probs.shape[1], p=probs[-1])))


def path_drafts(model: ToyModel, ctx: list[int], pick: Callable[[np.ndarray], int]) -> list[int]:
    out: list[int] = []
    for _ in range(2):
        out.append(pick(model.probs(ctx + out)))
    return out


def least_likely(p: np.ndarray) -> int:
    return int(np.where(p > 0, p, 2.0).argmin())  # the least likely allowed token


def most_likely(p: np.ndarray) -> int:
    return int(p.argmax())


def first_two_tokens(model: ToyModel, verifier: Verifier, policy: str, runs: int) -> np.ndarray:
    """Counts [V, V] of the first two tokens emitted after PROMPT, drafting 2 tokens a step."""
    rng = np.random.default_rng(20261203)
    counts = np.zeros((model.vocab, model.vocab), dtype=np.int64)
    for _ in range(runs):
        out: list[int] = []
        while len(out) < 2:
            ctx = PROMPT + out
            if policy == "random":
                d = rng.integers(0, model.vocab, size=2).tolist()
            else:
                d = path_drafts(model, ctx, least_likely if policy == "least" else most_likely)
            drafts = np.array(d, dtype=np.int64)
            out += verifier(drafts, model.rows(ctx, d), rng).tokens(drafts).tolist()
        counts[out[0], out[1]] += 1
    return counts


def exact_first_two(model: ToyModel) -> np.ndarray:
    p1 = model.probs(PROMPT)
    return np.array([p1[a] * model.probs(PROMPT + [a]) for a in range(model.vocab)])


# Drafts independent of the target hide a missing "remove the draft" (with uniformly random
# drafts, resampling from the full p is unbiased), so the negative controls use drafts that
# follow the target: its least and its most likely tokens.
CASES = [
    (verifier, policy, True)
    for verifier in (lossless, textbook)
    for policy in ("least", "most", "random")
] + [
    (resample_full, "least", False),
    (resample_full, "most", False),
    (accept_too_often, "least", False),
    (accept_too_often, "random", False),
]


@pytest.mark.parametrize(
    "verifier, policy, lossless_expected",
    CASES,
    ids=[f"{'ok' if ok else 'BIASED'}-{v.__name__}-{p}" for v, p, ok in CASES],
)
def test_sampling_reproduces_the_target_distribution(verifier, policy, lossless_expected):
    model = ToyModel(4, seed=11, sharpness=1.0)
    counts = first_two_tokens(model, verifier, policy, runs=6000)
    stat, dof = chi_square(counts, exact_first_two(model))
    p_value = chi_square_sf(stat, dof)
    if lossless_expected:
        assert p_value > 1e-3, (stat, dof)
    else:
        assert p_value < 1e-9, (stat, dof)  # the test has the power to catch a wrong rule


def test_chi_square_tail_matches_known_quantiles():
    assert chi_square_sf(3.841459, 1) == pytest.approx(0.05, rel=1e-5)
    assert chi_square_sf(11.0705, 5) == pytest.approx(0.05, rel=1e-4)
    assert chi_square_sf(2.0, 2) == pytest.approx(np.exp(-1.0), rel=1e-12)
    assert chi_square_sf(37.5662, 20) == pytest.approx(0.01, rel=1e-4)
    assert chi_square_sf(0.0, 3) == 1.0
