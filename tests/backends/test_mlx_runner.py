"""The MLX runner against the torch runner, step by step, on hand-built mixed batches."""

from __future__ import annotations

import numpy as np
import pytest

from localradix.config import ServerArgs
from localradix.loader import resolve_model
from localradix.platform import Target, backend_specs
from localradix.sampling_params import SamplingParams
from localradix.step import ForwardBatch, SamplingBatch

from .conftest import VOCAB, requires_mlx

pytestmark = requires_mlx

PARAMS = SamplingParams(temperature=0, logprobs=5)


def _runner(backend: str, folder, dtype: str = "float32"):
    spec = backend_specs()[backend]
    target = Target(backend, "cpu", dtype, spec.attention_backend)
    runner, _ = spec.create_runner(
        ServerArgs(max_total_tokens=256), resolve_model(str(folder)), target
    )
    return runner


def _step(runner, input_ids, slot_tables, prefix_lens):
    batch = ForwardBatch.build(
        [np.asarray(t, dtype=np.int64) for t in input_ids],
        [np.asarray(s, dtype=np.int64) for s in slot_tables],
        prefix_lens,
    )
    n = batch.num_reqs
    sb = SamplingBatch.build([PARAMS] * n, np.full(n, 0.5), [None] * n)
    return runner.forward(batch, sb)


def _script():
    """Steps of (new tokens, slot tables, prefix lengths): prefill, mixed, decode-only."""
    rng = np.random.default_rng(0)
    a, b, c = (rng.integers(3, VOCAB, n).tolist() for n in (10, 6, 4))
    slots_a, slots_b = list(range(1, 11)), list(range(11, 17))
    yield [a, b], [slots_a, slots_b], [0, 0]
    # decode A, extend C on A's cached prefix, decode B: decode rows are not contiguous
    slots_a2 = slots_a + [17]
    slots_c = slots_a + list(range(18, 22))
    slots_b2 = slots_b + [22]
    yield [[5], c, [6]], [slots_a2, slots_c, slots_b2], [10, 10, 6]
    # decode-only: three requests with different lengths (padded slot table)
    yield (
        [[7], [8], [9]],
        [slots_a2 + [23], slots_c + [24], slots_b2 + [25]],
        [11, 14, 7],
    )
    # one request alone on non-contiguous slots, then a fresh extend with no prefix
    yield [[10]], [slots_c + [24, 26]], [15]
    yield [a[:3]], [[30, 31, 32]], [0]


def test_mixed_batches_match_torch_runner(tiny_model):
    folder, _ = tiny_model("qwen3")
    torch_runner, mlx_runner = _runner("cpu", folder), _runner("mlx", folder)
    assert mlx_runner.kv_capacity == torch_runner.kv_capacity == 256
    for step in _script():
        ref, got = _step(torch_runner, *step), _step(mlx_runner, *step)
        assert got.token_ids.tolist() == ref.token_ids.tolist()
        assert got.top_ids.tolist() == ref.top_ids.tolist()
        np.testing.assert_allclose(got.top_logprobs, ref.top_logprobs, atol=1e-4)


def test_batched_equals_alone(tiny_model):
    folder, _ = tiny_model("llama")
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, VOCAB, n).tolist() for n in (9, 3, 17)]
    tables = [list(range(1, 10)), list(range(10, 13)), list(range(13, 30))]
    batched = _step(_runner("mlx", folder), prompts, tables, [0, 0, 0])
    for i, (p, t) in enumerate(zip(prompts, tables, strict=True)):
        alone = _step(_runner("mlx", folder), [p], [t], [0])
        assert alone.token_ids[0] == batched.token_ids[i]
        np.testing.assert_allclose(alone.logprobs[0], batched.logprobs[i], atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_close_to_fp32(tiny_model, dtype):
    folder, _ = tiny_model("qwen2")
    steps = list(_script())[:2]
    ref_runner, half_runner = _runner("mlx", folder), _runner("mlx", folder, dtype)
    for step in steps:
        ref, got = _step(ref_runner, *step), _step(half_runner, *step)
        assert np.all(np.isfinite(got.top_logprobs))
        np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=0.25)
