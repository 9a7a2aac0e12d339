"""The default KV pool: a few contexts of the model, bf16 K/V, said in the log and in doctor."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import psutil
import pytest

from localradix.config import ServerArgs
from localradix.runner.kv_budget import KVShape, default_kv_dtype, plan_kv_budget
from localradix.runner.runner_config import RunnerConfig

from .conftest import bundled_gguf

GIB = 2**30
SMOLLM = KVShape(layers=30, kv_heads=3, head_dim=64, dtype="bfloat16")  # SmolLM2-135M


def test_the_default_pool_holds_four_contexts_and_says_so():
    budget = plan_kv_budget(RunnerConfig.of(), SMOLLM, context_len=8192, free_bytes=20 * GIB)
    assert budget.tokens == 4 * 8192 and budget.bytes == 720 * 2**20
    assert budget.describe() == (
        "KV pool: 32,768 tokens x 30 layers x 3 KV heads x 64 dims x 2 (K, V) x 2 bytes "
        "(bfloat16) = 720 MiB (4 x 8,192-token context); set --max-total-tokens to change"
    )


def test_memory_caps_the_pool_and_flags_override():
    capped = plan_kv_budget(RunnerConfig.of(), SMOLLM, context_len=8192, free_bytes=1 * GIB)
    assert capped.tokens == GIB // 4 // SMOLLM.bytes_per_token
    assert "--mem-fraction 0.25 of 1.0 GiB free" in capped.reason
    assert "would need 720 MiB" in capped.reason
    half = plan_kv_budget(RunnerConfig.of(mem_fraction=0.5), SMOLLM, 8192, 1 * GIB)
    assert half.tokens == GIB // 2 // SMOLLM.bytes_per_token
    tiny = plan_kv_budget(RunnerConfig.of(), SMOLLM, 8192, free_bytes=1000)
    assert tiny.tokens == 1024 and "1,024 tokens at least" in tiny.reason
    explicit = plan_kv_budget(RunnerConfig.of(max_total_tokens=1000), SMOLLM, 8192, 1000)
    assert (explicit.tokens, explicit.reason) == (1000, "--max-total-tokens")
    short = plan_kv_budget(RunnerConfig.of(), SMOLLM, context_len=512, free_bytes=20 * GIB)
    assert short.tokens == 16_384 and short.reason.startswith("at least 16,384 tokens")


def test_kv_dtype_is_bf16_for_an_auto_float32_model_only():
    from localradix.platform import choose_backend, resolve_target

    assert default_kv_dtype("auto", "float32") == "bfloat16"
    assert default_kv_dtype("float32", "float32") == "float32"  # exact comparisons stay exact
    assert default_kv_dtype("auto", "bfloat16") == "bfloat16"
    assert default_kv_dtype("float16", "float16") == "float16"
    assert KVShape(30, 3, 64, "float32").bytes_per_token == 2 * SMOLLM.bytes_per_token
    cpu = choose_backend("cpu")
    auto = resolve_target(cpu, ServerArgs(backend="cpu"))
    assert (auto.dtype, auto.cache_dtype) == ("float32", "bfloat16")
    exact = resolve_target(cpu, ServerArgs(backend="cpu", dtype="float32"))
    assert (exact.dtype, exact.cache_dtype) == ("float32", "float32")


# ---- the bundled model ---------------------------------------------------------------------

GGUF = bundled_gguf()
bundled = pytest.mark.skipif(GGUF is None, reason="the bundled model is not installed")
ROOMY = psutil.virtual_memory().available * 0.25 > 2 * 720 * 2**20  # the default is not capped


@pytest.fixture(scope="module")
def smollm():
    from localradix.loader import load_model, load_tokenizer

    model, config = load_model(str(GGUF), "float32", "cpu")
    return model, config, load_tokenizer(str(GGUF))


@bundled
@pytest.mark.skipif(not ROOMY, reason="too little free memory for the uncapped default")
def test_cpu_runner_reserves_four_contexts_in_bf16_and_logs_it(smollm, caplog):
    import torch

    from localradix.runner.torch_runner import TorchRunner

    model, config, _ = smollm
    with caplog.at_level(logging.INFO, logger="localradix.runner"):
        runner = TorchRunner(
            model, config, RunnerConfig.of(), "cpu", torch.float32, kv_dtype=torch.bfloat16
        )
    assert runner.kv_capacity == 4 * 8192
    assert runner.attn.k_cache.dtype == torch.bfloat16 and model.dtype == torch.float32
    assert "KV pool: 32,768 tokens x 30 layers" in caplog.text
    assert "= 720 MiB (4 x 8,192-token context)" in caplog.text
    exact = TorchRunner(model, config, RunnerConfig.of(max_total_tokens=64), "cpu", torch.float32)
    assert exact.kv_capacity == 64 and exact.attn.k_cache.dtype == torch.float32


@bundled
@pytest.mark.slow
def test_bf16_kv_decodes_like_fp32_kv(smollm):
    """Greedy decoding through the cache (prefill, then one token a step) is unchanged."""
    import torch

    from localradix.runner.torch_runner import TorchRunner
    from localradix.step import ForwardBatch

    model, config, tokenizer = smollm
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}],
            add_generation_prompt=True,
        )
    )
    runs = {}
    for name, kv_dtype in (("auto", torch.bfloat16), ("float32", torch.float32)):
        args = RunnerConfig.of(max_total_tokens=256)
        runner = TorchRunner(model, config, args, "cpu", torch.float32, kv_dtype=kv_dtype)
        ids, new, prefix, steps = list(prompt), list(prompt), 0, []
        for _ in range(12):
            slots = np.arange(1, len(ids) + 1)
            logits = runner.logits(ForwardBatch.build([np.array(new)], [slots], [prefix]))[0]
            steps.append(logits)
            prefix, new = len(ids), [int(logits.argmax())]
            ids += new
        runs[name] = (ids[len(prompt) :], torch.stack(steps))
    (bf16_ids, bf16_logits), (fp32_ids, fp32_logits) = runs["auto"], runs["float32"]
    assert bf16_ids == fp32_ids
    assert "Paris" in tokenizer.decode(bf16_ids)
    torch.testing.assert_close(bf16_logits, fp32_logits, atol=0.5, rtol=0)  # measured: 0.16


@bundled
@pytest.mark.slow
@pytest.mark.skipif(not ROOMY, reason="too little free memory for the uncapped default")
def test_doctor_prints_the_pool_serve_would_reserve():
    out = subprocess.run(
        [sys.executable, "-m", "localradix", "doctor", "--backend", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "KV pool for SmolLM2-135M-Instruct on cpu (cpu), as serve reserves it" in out
    assert "  32,768 tokens x 30 layers x 3 KV heads x 64 dims x 2 (K, V) x 2 bytes " in out
    flagged = subprocess.run(
        [sys.executable, "-m", "localradix", "doctor", "--backend", "cpu", "--json",
         "--max-total-tokens", "4096", "--dtype", "float32"],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert '"tokens": 4096' in flagged and '"dtype": "float32"' in flagged


@bundled
@pytest.mark.skipif(not ROOMY, reason="too little free memory for the uncapped default")
def test_llamacpp_sizes_its_cells_the_same_way():
    pytest.importorskip("llama_cpp")
    from localradix.backends.llamacpp.runner import LlamaCppRunner
    from localradix.platform import Target

    target = Target("llamacpp", "cpu", "float16", "llama.cpp")
    runner = LlamaCppRunner(GGUF, RunnerConfig.of(max_running_requests=4), target)
    try:
        assert runner.kv_capacity == 4 * 8192
        assert runner.kv_budget.shape == KVShape(30, 3, 64, "float16")
    finally:
        runner.close()
