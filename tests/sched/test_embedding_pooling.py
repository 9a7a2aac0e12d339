"""Pooling an embedding chunk by chunk gives the vector of the whole prompt pooled at once."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from localradix.messages import Embed
from localradix.sched.embedding import add_chunk, vector


@given(
    tokens=st.integers(1, 40),
    cuts=st.lists(st.integers(1, 39), max_size=5),
    pooling=st.sampled_from(["last", "mean"]),
    normalize=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_chunked_pooling_equals_whole_prompt_pooling(tokens, cuts, pooling, normalize, seed):
    hidden = np.random.default_rng(seed).standard_normal((tokens, 8)).astype(np.float32)
    embed = Embed(pooling, normalize)
    bounds = [0, *sorted({c for c in cuts if c < tokens}), tokens]
    total = None
    for start, end in zip(bounds, bounds[1:]):  # what the runner returns per chunk
        chunk = hidden[start:end]
        total = add_chunk(total, chunk[-1] if pooling == "last" else chunk.sum(0), embed)
    assert total is not None
    want = hidden[-1] if pooling == "last" else hidden.mean(0)
    if normalize:
        want = want / np.linalg.norm(want)
    np.testing.assert_allclose(vector(total, tokens, embed), want, rtol=1e-5, atol=1e-5)


def test_a_normalised_vector_has_unit_length_and_a_zero_vector_stays_zero():
    assert abs(np.linalg.norm(vector(np.array([3.0, 4.0]), 1, Embed("last", True))) - 1) < 1e-9
    assert vector(np.zeros(3), 2, Embed("mean", True)) == (0.0, 0.0, 0.0)
