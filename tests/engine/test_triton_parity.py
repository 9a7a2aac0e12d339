"""The whole engine over the Triton attention kernels (`--attention triton`), run on the CPU by
Triton's interpreter: greedy tokens equal transformers', alone, batched and cached, chunked,
paged, and retracted under KV pressure."""

from __future__ import annotations

import pytest

from localradix import Engine, SamplingParams

from .conftest import hf_greedy, random_prompts, token_lists

pytest.importorskip("triton")
from localradix.backends.cuda.triton_attention import interpreter_active  # noqa: E402

if not interpreter_active():  # tests/conftest.py turns it on without a GPU
    pytest.skip(
        "triton runs compiled here (a GPU): see test_gpu_devices.py", allow_module_level=True
    )
# Triton 3.6's interpreter turns 1-element arrays into scalars, which numpy deprecates.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]
NEW = 12
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)


def _engine(folder, **kw) -> Engine:
    return Engine(str(folder), backend="cpu", dtype="float32", attention="triton", **kw)


@pytest.fixture(autouse=True)
def kernel_calls(monkeypatch):
    """Counts the layers attended by the Triton backend (the engine runs in this process)."""
    from localradix.backends.cuda.triton_attention import TritonAttention

    calls = {"decode": 0, "extend": 0}
    for kind in calls:
        real = getattr(TritonAttention, f"_{kind}_attention")

        def counted(self, *args, _real=real, _kind=kind):
            calls[_kind] += 1
            return _real(self, *args)

        monkeypatch.setattr(TritonAttention, f"_{kind}_attention", counted)
    yield calls
    assert calls["decode"] > 0 and calls["extend"] > 0


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_alone_batched_cached_and_chunked_match_transformers(tiny_model, arch):
    folder, hf = tiny_model(arch)
    prompts = random_prompts(1, lengths=(5, 40, 64, 3))
    prompts.append(prompts[2] + [7, 8, 9])  # shares a long prefix: a hit on the second pass
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with _engine(folder, max_total_tokens=4096, chunked_prefill_size=16) as engine:
        assert [engine.generate([p], GREEDY)[0].token_ids for p in prompts] == refs
        again = engine.generate(prompts, GREEDY)  # batched, every prompt now cached
        assert token_lists(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts))
        engine.check_invariants(idle=True)


def test_paged_and_retracted_match_transformers(tiny_model):
    folder, hf = tiny_model("llama")
    prompts = random_prompts(4, lengths=(40, 41, 42, 43, 44, 45))
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    refs = [hf_greedy(hf, p, 40) for p in prompts]
    with _engine(folder, max_total_tokens=300, new_token_ratio=0.05, page_size=16) as engine:
        assert token_lists(engine.generate(prompts, params)) == refs
        assert engine.stats().retractions > 0
        engine.check_invariants(idle=True)
