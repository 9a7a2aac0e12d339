"""The sampler's filters, penalties and inverse-CDF draw on hand-made logits."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from localradix.runner.sampler import apply_penalties, sample
from localradix.sampling_params import SamplingParams
from localradix.step import SamplingBatch

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def _batch(params: SamplingParams, u: float, history=None) -> SamplingBatch:
    return SamplingBatch.build([params], np.array([u]), [history])


def test_greedy_is_argmax():
    out = sample(LOGITS, _batch(SamplingParams(temperature=0), 0.99))
    assert out.token_ids.tolist() == [0]


def test_inverse_cdf_picks_by_uniform():
    p = SamplingParams(temperature=1.0)
    picks = [int(sample(LOGITS, _batch(p, u)).token_ids[0]) for u in (0.1, 0.6, 0.85, 0.99)]
    assert picks == [0, 1, 2, 3]


def test_top_k_top_p_min_p_cut_the_tail():
    for p in (
        SamplingParams(temperature=1.0, top_k=2),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.5),
    ):
        assert int(sample(LOGITS, _batch(p, 0.999)).token_ids[0]) == 1


def test_draws_follow_the_distribution():
    p = SamplingParams(temperature=1.0)
    u = np.random.default_rng(0).random(4000)
    sb = SamplingBatch.build([p] * len(u), u, [None] * len(u))
    tokens = sample(LOGITS.repeat(len(u), 1), sb).token_ids
    freq = np.bincount(tokens, minlength=4) / len(u)
    assert np.allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.03)


def test_penalties():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    ids = np.array([0, 1, 2, 2])  # prompt [0, 1], generated [2, 2]
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    out = apply_penalties(logits, _batch(p, 0.5, (ids, 2)))
    # repetition: 2 -> 1, -2 -> -4, 1 -> 0.5; then token 2: -0.5*2 - 0.25
    assert torch.allclose(out, torch.tensor([[1.0, -4.0, 0.5 - 1.0 - 0.25, 0.5]]))


def test_logprobs_are_normalised():
    p = SamplingParams(temperature=0, logprobs=2)
    out = sample(LOGITS, _batch(p, 0.5))
    assert np.isclose(out.logprobs[0], np.log(0.5), atol=1e-5)
    assert out.top_ids.tolist() == [[0, 1]]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    top_k=st.sampled_from([-1, 1, 2, 5]),
    top_p=st.sampled_from([1.0, 0.9, 0.5]),
    min_p=st.sampled_from([0.0, 0.1]),
    mate_filters=st.booleans(),
)
def test_a_seeded_row_picks_the_same_token_whatever_its_batch_mates(
    seed: int, top_k: int, top_p: float, min_p: float, mate_filters: bool
) -> None:
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(rng.normal(size=(2, 12)).astype(np.float32))
    row = SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, min_p=min_p)
    mate = SamplingParams(temperature=1.0, top_k=3 if mate_filters else -1)
    u = rng.random(2)
    alone = sample(logits[:1], SamplingBatch.build([row], u[:1], [None]))
    batched = sample(logits, SamplingBatch.build([row, mate], u, [None, None]))
    assert alone.token_ids[0] == batched.token_ids[0]
