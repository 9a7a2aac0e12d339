"""The MLX sampler against the torch sampler on the same logits, params and uniform draws."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localradix.backends.mlx import sampler as mlx_sampler  # noqa: E402
from localradix.runner import sampler as torch_sampler  # noqa: E402
from localradix.runner.base import SamplingBatch  # noqa: E402
from localradix.sampling_params import SamplingParams as SP  # noqa: E402

VOCAB = 257
PARAMS = [
    SP(temperature=0),
    SP(temperature=1.0),
    SP(temperature=0.7, top_k=5),
    SP(temperature=1.3, top_p=0.6),
    SP(temperature=0.9, min_p=0.2),
    SP(temperature=1.0, top_k=40, top_p=0.9, min_p=0.05),
    SP(temperature=0.5, top_k=1),
    SP(temperature=2.0, top_p=0.3),
]


def _logits(rows: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, VOCAB)) * 3).astype(np.float32)


def _both(logits: np.ndarray, sb: SamplingBatch):
    ref = torch_sampler.sample(torch.from_numpy(logits), sb)
    got = mlx_sampler.sample(mx.array(logits), sb)
    return ref, got


def _histories(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, VOCAB, 30), 12) for _ in range(rows)]


@pytest.mark.parametrize("seed", range(6))
def test_mixed_batch_matches_torch(seed):
    rng = np.random.default_rng(100 + seed)
    uniform = rng.random(len(PARAMS))
    sb = SamplingBatch.build(PARAMS, uniform, [None] * len(PARAMS))
    ref, got = _both(_logits(len(PARAMS), seed), sb)
    assert got.token_ids.dtype == np.int64
    assert got.token_ids.tolist() == ref.token_ids.tolist()


def test_greedy_only_and_top_k_one():
    params = [SP(temperature=0), SP(temperature=1.0, top_k=1)]
    sb = SamplingBatch.build(params, np.array([0.3, 0.9]), [None, None])
    ref, got = _both(_logits(2, 7), sb)
    assert got.token_ids.tolist() == ref.token_ids.tolist()


def test_many_draws_match_token_for_token():
    p = SP(temperature=1.0, top_p=0.95)
    u = np.random.default_rng(0).random(500)
    sb = SamplingBatch.build([p] * len(u), u, [None] * len(u))
    logits = np.repeat(_logits(1, 3), len(u), axis=0)
    ref, got = _both(logits, sb)
    assert (got.token_ids == ref.token_ids).mean() > 0.995  # float ties at CDF edges only


@pytest.mark.parametrize(
    "params",
    [
        SP(repetition_penalty=1.5),
        SP(frequency_penalty=0.7, presence_penalty=-0.4),
        SP(repetition_penalty=0.8, frequency_penalty=-1.0, presence_penalty=1.5),
    ],
)
def test_penalties_match_torch(params):
    params_list = [params, SP(temperature=0), params.replace(temperature=0)]
    hist = _histories(3, 1)
    hist[1] = None  # a request without penalties in the same batch
    sb = SamplingBatch.build(params_list, np.array([0.2, 0.5, 0.8]), hist)
    logits = _logits(3, 11)
    ref = torch_sampler.apply_penalties(torch.from_numpy(logits), sb).numpy()
    got = np.array(mlx_sampler.apply_penalties(mx.array(logits), sb))
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    ref_out, got_out = _both(logits, sb)
    assert got_out.token_ids.tolist() == ref_out.token_ids.tolist()


@pytest.mark.parametrize("k", [0, 1, 5])
def test_logprobs_match_torch(k):
    params = [SP(temperature=0, logprobs=k), SP(temperature=1.0, logprobs=k), SP(temperature=0)]
    sb = SamplingBatch.build(params, np.array([0.1, 0.4, 0.6]), [None] * 3)
    ref, got = _both(_logits(3, 5), sb)
    assert got.token_ids.tolist() == ref.token_ids.tolist()
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)
    if k == 0:
        assert got.top_ids is None and ref.top_ids is None
    else:
        assert got.top_ids.tolist() == ref.top_ids.tolist()
        np.testing.assert_allclose(got.top_logprobs, ref.top_logprobs, atol=1e-5)


def test_no_logprobs_when_not_asked():
    sb = SamplingBatch.build([SP(temperature=0)], np.array([0.5]), [None])
    _, got = _both(_logits(1, 2), sb)
    assert got.logprobs is None and got.top_ids is None


@pytest.mark.skipif(
    "vocab_mask" not in SamplingBatch.__dataclass_fields__, reason="no grammar bitmask yet"
)
@pytest.mark.parametrize("greedy", [True, False])
def test_grammar_bitmask_matches_torch(greedy):
    rng = np.random.default_rng(4)
    words = (VOCAB + 31) // 32
    mask = rng.integers(-(2**31), 2**31, (3, words), dtype=np.int64).astype(np.int32)
    mask[1] = 0
    mask[1, 3] = 1 << 5  # only token 3 * 32 + 5 allowed
    temperature = 0 if greedy else 1.0
    params = [SP(temperature=temperature, logprobs=2)] * 3
    sb = SamplingBatch.build(params, rng.random(3), [None] * 3, vocab_mask=mask)
    logits = _logits(3, 9)
    ref = torch_sampler.apply_vocab_mask(torch.from_numpy(logits), mask).numpy()
    got = np.array(mlx_sampler.apply_vocab_mask(mx.array(logits), mask))
    np.testing.assert_array_equal(got, ref)
    ref_out, got_out = _both(logits, sb)
    assert got_out.token_ids.tolist() == ref_out.token_ids.tolist()
    assert got_out.token_ids[1] == 3 * 32 + 5
    np.testing.assert_allclose(got_out.logprobs, ref_out.logprobs, atol=1e-5)
