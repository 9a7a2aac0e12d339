"""The captured sampler (`SamplingBuffers`) against the eager sampler, on CPU tensors.

A graph's sampler reads fixed parameter buffers and samples every row of the padded batch; the
real rows must get exactly the eager sampler's tokens on the same logits (greedy and seeded
random alike), and padding rows must be greedy rows that nothing reads back.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localradix.runner.sampler import _filter_mask, sample, sample_rows
from localradix.runner.sampling_buffers import (
    PADDING,
    TEMPERATURE,
    SamplingBuffers,
    samples_in_graph,
)
from localradix.sampling_params import SamplingParams
from localradix.step import SamplingBatch

VOCAB = 300


def _params(rng: np.random.Generator) -> SamplingParams:
    """Greedy, plain random, or random with some of top-k / top-p / min-p."""
    kind = int(rng.integers(4))
    if kind == 0:
        return SamplingParams(temperature=0.0)
    temperature = float(rng.uniform(0.3, 1.5))
    if kind == 1:
        return SamplingParams(temperature=temperature)
    return SamplingParams(
        temperature=temperature,
        top_k=int(rng.choice([-1, 5, 50])),
        top_p=float(rng.choice([1.0, 0.9, 0.5])),
        min_p=float(rng.choice([0.0, 0.05])),
    )


def _batch(rng: np.random.Generator, n: int) -> SamplingBatch:
    params = [_params(rng) for _ in range(n)]
    return SamplingBatch.build(params, rng.random(n), [None] * n)


def _logits(rng: np.random.Generator, rows: int) -> torch.Tensor:
    return torch.from_numpy(rng.normal(0, 3, (rows, VOCAB)).astype(np.float32))


@pytest.mark.parametrize("seed", range(12))
def test_captured_sampler_equals_the_eager_one(seed):
    rng = np.random.default_rng(seed)
    bufs = SamplingBuffers(16, "cpu")
    for n, size in ((3, 4), (8, 8), (1, 2), (5, 16)):
        sb, logits = _batch(rng, n), _logits(rng, size)
        bufs.fill(sb, size)
        bufs.sample(logits)
        want = sample(logits[:n], sb).token_ids
        np.testing.assert_array_equal(bufs.token_ids[:n].numpy(), want)


def test_greedy_rows_are_the_argmax():
    rng = np.random.default_rng(0)
    bufs = SamplingBuffers(8, "cpu")
    sb = SamplingBatch.build([SamplingParams(temperature=0.0)] * 5, rng.random(5), [None] * 5)
    logits = _logits(rng, 8)
    bufs.fill(sb, 8)
    bufs.sample(logits)
    np.testing.assert_array_equal(bufs.token_ids.numpy(), logits.argmax(-1).numpy())


def test_each_fill_replaces_every_row_up_to_the_size():
    """A smaller batch after a larger one: rows past it are padding, not the last batch's."""
    rng = np.random.default_rng(1)
    bufs = SamplingBuffers(8, "cpu")
    hot = SamplingParams(temperature=1.3, top_p=0.7, top_k=9, min_p=0.1)
    bufs.fill(SamplingBatch.build([hot] * 8, rng.random(8), [None] * 8), 8)
    small = _batch(rng, 2)
    bufs.fill(small, 4)
    got = bufs.params.numpy()
    np.testing.assert_array_equal(got[:, 2:4], np.array(PADDING)[:, None].repeat(2, 1))
    np.testing.assert_allclose(got[TEMPERATURE, :2], small.temperature)


def test_seeded_rows_follow_their_draw_not_their_batch():
    """The same seeded row (same draw) gets the same token in any batch and any graph size."""
    rng = np.random.default_rng(2)
    row = _logits(rng, 1)
    p = SamplingParams(temperature=1.0, top_p=0.9)
    alone = SamplingBatch.build([p], np.array([0.37]), [None])
    bufs = SamplingBuffers(8, "cpu")
    bufs.fill(alone, 1)
    bufs.sample(row)
    token = int(bufs.token_ids[0])
    mates = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=3)]
    mixed = SamplingBatch.build([*mates, p], np.array([0.1, 0.8, 0.37]), [None] * 3)
    logits = torch.cat([_logits(rng, 2), row, _logits(rng, 5)])
    bufs.fill(mixed, 8)
    bufs.sample(logits)
    assert int(bufs.token_ids[2]) == token == int(sample(row, alone).token_ids[0])


def test_a_row_without_filters_cuts_nothing():
    """top-p 1 cuts no token even where cumulative sums round past 1, so the always-filtering
    graph sampler and the eager one (which skips filters when no row filters) agree."""
    rng = np.random.default_rng(3)
    probs = torch.softmax(torch.from_numpy(rng.normal(0, 1, (64, 50_000)).astype(np.float32)), -1)
    sorted_probs = probs.sort(dim=-1, descending=True).values
    off = torch.ones(64), torch.zeros(64, dtype=torch.long), torch.zeros(64)
    assert not _filter_mask(sorted_probs, *off).any()
    u = torch.from_numpy(rng.random(64).astype(np.float32))
    temperature = torch.ones(64)
    logits = probs.log()
    with_filters = sample_rows(logits, temperature, *off, u, filters=True)
    without = sample_rows(logits, temperature, *off, u, filters=False)
    assert torch.equal(with_filters, without)


def test_what_the_graph_cannot_sample():
    rng = np.random.default_rng(4)
    plain = SamplingParams(temperature=0.8)
    assert samples_in_graph(SamplingBatch.build([plain] * 2, rng.random(2), [None] * 2), 2)
    assert not samples_in_graph(None, 2)
    logprobs = SamplingBatch.build([plain.replace(logprobs=0)] * 2, rng.random(2), [None] * 2)
    assert not samples_in_graph(logprobs, 2)
    history = (np.array([1, 2, 3]), 2)
    penalty = plain.replace(repetition_penalty=1.2)
    assert not samples_in_graph(SamplingBatch.build([penalty], rng.random(1), [history]), 1)
    mask = np.full((2, (VOCAB + 31) // 32), -1, dtype=np.int32)
    masked = SamplingBatch.build([plain] * 2, rng.random(2), [None] * 2, mask)
    assert not samples_in_graph(masked, 2)
    # A verify step samples several rows per request.
    assert not samples_in_graph(SamplingBatch.build([plain] * 3, rng.random(3), [None] * 3), 2)
