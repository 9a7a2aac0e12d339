"""The engine-parity scaffolding the model-family tests share (tests/models/test_gemma3.py,
test_gemma4.py, test_gpt_oss.py, test_moe.py, test_phi3_smollm3.py): a tiny random-weight
transformers model saved with a word-level tokenizer, then the Engine on the CPU backend
greedy token for token like transformers alone, batched and cached, chunked and retracted;
logits step by step; the Triton interpreter's guard; the backends' and TP's refusals.

Each check asserts what the families' tests asserted one by one; family-specific checks
(cache hits inside or past a window, past a RoPE length) stay in the test, on the results
these return."""

from __future__ import annotations

import pytest
import torch
from engine.conftest import _word_level_tokenizer, hf_greedy

from localradix import Engine, SamplingParams
from localradix.models import ModelConfig


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def save_checkpoint(tmp_path_factory: pytest.TempPathFactory, name: str, model):
    """(saved folder with a word-level tokenizer, the transformers model)."""
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    _word_level_tokenizer(folder)
    return folder, model


def cpu_engine(folder, **options: object) -> Engine:
    """The Engine on the CPU backend in float32 (4096 tokens of KV unless told)."""
    return Engine(
        str(folder), backend="cpu", dtype="float32", **{"max_total_tokens": 4096, **options}
    )


def run_on(engine: Engine, prompt: list[int], ref: list[int], k: int, n: int):
    """The prompt followed by the first k tokens of its greedy reference: the next n tokens
    must be the reference's. Returns the result (for its cached_tokens)."""
    result = engine.generate([prompt + ref[:k]], greedy(n))[0]
    assert result.token_ids == ref[k : k + n]
    return result


def check_alone_batched_cached(folder, hf, prompts, new: int, runs_on=()):
    """Each prompt alone, then all batched with every prompt cached, like transformers' greedy.
    runs_on: (prompt index, k, n) each, a `run_on` on the warm cache. Returns (the batched
    results, the runs-on results)."""
    refs = [hf_greedy(hf, p, new) for p in prompts]
    with cpu_engine(folder) as engine:
        assert [engine.generate([p], greedy(new))[0].token_ids for p in prompts] == refs
        again = engine.generate(prompts, greedy(new))  # batched, every prompt now cached
        assert tokens(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts, strict=True))
        ran_on = [run_on(engine, prompts[i], refs[i], k, n) for i, k, n in runs_on]
        engine.check_invariants(idle=True)
    return again, ran_on


def check_chunked(folder, hf, prompts, new: int, chunk: int, tail: int | None = None) -> None:
    """Batched prompts prefilled in chunks of `chunk` tokens, like transformers' greedy. With
    `tail`: then, cache flushed, each prompt plus all but the last `tail` tokens of its
    reference (prefilled in chunks again) must continue with those."""
    refs = [hf_greedy(hf, p, new) for p in prompts]
    with cpu_engine(folder, chunked_prefill_size=chunk) as engine:
        assert tokens(engine.generate(prompts, greedy(new))) == refs
        if tail is not None:
            k = new - tail
            longer = [p + r[:k] for p, r in zip(prompts, refs, strict=True)]
            engine.flush_cache()
            assert tokens(engine.generate(longer, greedy(tail))) == [r[k:] for r in refs]
        engine.check_invariants(idle=True)


def check_retraction(folder, hf, prompts, new: int, max_total_tokens: int) -> None:
    """A batch whose KV does not fit `max_total_tokens`: decode retracts, tokens unchanged."""
    refs = [hf_greedy(hf, p, new) for p in prompts]
    with cpu_engine(folder, max_total_tokens=max_total_tokens, new_token_ratio=0.05) as engine:
        assert tokens(engine.generate(prompts, greedy(new))) == refs
        assert engine.stats().retractions > 0
        engine.check_invariants(idle=True)


def check_stepped_logits(stepper, hf, prompt: list[int], softcap: float) -> None:
    """Our logits (a `make_stepper` stepper) of the whole prompt, then of one decode step,
    equal transformers'; its logits are soft-capped at `softcap`."""
    ours = stepper.step({"a": prompt})["a"]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    assert ref.abs().max() <= softcap
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    token = int(ref[-1].argmax())
    ours = stepper.step({"a": [token]})["a"]
    with torch.no_grad():
        ref = hf(torch.tensor([[*prompt, token]])).logits[0, -1:]
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def triton_interpreter():
    """localradix's Triton attention module, or a skip unless its kernels run in Triton's
    interpreter (on a GPU they run compiled; tests/backends/test_gpu_devices.py)."""
    pytest.importorskip("triton")
    from localradix.backends.cuda import triton_attention

    if not triton_attention.interpreter_active():
        pytest.skip("triton runs compiled here (a GPU)")
    return triton_attention


def refusing_attention(name: str, flag: str) -> type:
    """A torch-native attention backend named `name` that says it lacks `flag` (e.g.
    "applies_windows"): the model's load must refuse it by name."""
    from localradix.runner.attention_torch import TorchNativeAttention

    return type(name, (TorchNativeAttention,), {flag: False})


def check_tp_refuses(config: ModelConfig, match: str) -> None:
    """--tp 2 refuses the model with `match`; one rank (no split) accepts it."""
    from localradix.model_api.shard import Shard

    with pytest.raises(ValueError, match=match):
        Shard(0, 2).check(config)
    Shard(0, 1).check(config)
