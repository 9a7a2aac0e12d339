"""Tensor parallelism on the CPU (gloo, 2 ranks): greedy tokens equal the single-rank ones
(transformers', which the single-rank engine matches in test_parity) alone, batched, cached,
chunked and retracted; each rank holds half the weights; a dead rank is reported by number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from localradix import Engine, SamplingParams
from localradix.loader import load_model
from localradix.runner.torch_runner import resident_bytes

from .conftest import _word_level_tokenizer, hf_greedy, random_prompts, token_lists

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

NEW = 10
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)
# Parameters split across the ranks; the rest (norms, the RoPE table) is replicated.
SPLIT = ("embed_tokens", "lm_head", "qkv_weight", "qkv_bias", "o_weight", "gate_up", "down")


def _engine(folder: Path, **kw: object) -> Engine:
    kw = {"max_total_tokens": 4096, **kw}
    return Engine(str(folder), backend="cpu", dtype="float32", tp=2, **kw)


@pytest.fixture(scope="module")
def llama_kv1(tmp_path_factory):
    """A tiny Llama with ONE KV head (at tp=2 both ranks hold a copy of it) and an odd vocab
    (rank 1's embedding and LM head rows end in padding)."""
    import transformers

    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=515, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=1024,
        eos_token_id=1, bos_token_id=2, initializer_range=0.2, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("tiny-llama-kv1")
    model.save_pretrained(folder)
    _word_level_tokenizer(folder)
    return folder, model


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_alone_batched_cached_and_chunked_match(tiny_model, arch):
    folder, hf = tiny_model(arch)
    prompts = random_prompts(1)
    shared = prompts[3]
    prompts += [shared + [7, 8, 9]]
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    threads = torch.get_num_threads()
    with _engine(folder, chunked_prefill_size=16) as engine:  # prompts of 17+ come in chunks
        alone = [engine.generate([p], GREEDY)[0].token_ids for p in prompts]
        assert alone == refs
        again = engine.generate(prompts, GREEDY)  # batched, every prompt now cached
        assert token_lists(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts))
        engine.check_invariants(idle=True)
        runner = engine.core.runner
        assert runner.comm.size == 2 and len(runner.rank_weight_bytes) == 2
        _assert_half_the_weights(folder, runner.rank_weight_bytes)
    assert torch.get_num_threads() == threads  # rank 0 gave back the cores it shared


def test_retraction_with_overlap_matches(tiny_model):
    """Decode under KV pressure retracts requests; overlap scheduling sends rank 0's
    placeholder-resolved input ids to the other rank by broadcast."""
    folder, hf = tiny_model("llama")
    prompts = random_prompts(4, lengths=(40, 41, 42, 43, 44, 45))
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    refs = [hf_greedy(hf, p, 40) for p in prompts]
    with _engine(
        folder, max_total_tokens=300, new_token_ratio=0.05, overlap_schedule="on"
    ) as engine:
        assert token_lists(engine.generate(prompts, params)) == refs
        assert engine.stats().retractions > 0


def test_replicated_kv_head_matches_and_a_dead_rank_is_named(llama_kv1):
    folder, hf = llama_kv1
    prompts = random_prompts(5, lengths=(30, 7, 12))
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with _engine(folder) as engine:
        assert token_lists(engine.generate(prompts, GREEDY)) == refs
        worker = engine.core.runner.ranks.procs[0]
        worker.kill()
        worker.wait()
        result = engine.generate(prompts[:1], GREEDY)[0]
        assert result.finish_reason == "error"
        assert "tensor-parallel rank 1 exited with code -9" in (result.error or "")


def test_gguf_and_unsplittable_models_are_refused_before_any_rank_starts(tiny_model, tmp_path):
    from localradix.backends.torch_device import create_torch_runner
    from localradix.config import ServerArgs
    from localradix.resolve import Target
    from localradix.store.source import ModelSource

    folder, _ = tiny_model("llama")
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 3}))
    args, target = ServerArgs(tp=2), Target("cpu", "cpu", "float32")
    with pytest.raises(ValueError, match="--tp 2 cannot split 3 attention heads"):
        create_torch_runner(args, ModelSource(tmp_path, "hf", "odd"), target)
    gguf = ModelSource(tmp_path / "model.gguf", "gguf", "model")
    with pytest.raises(ValueError, match="--tp 2 loads Hugging Face safetensors folders"):
        create_torch_runner(args, gguf, target)


def _assert_half_the_weights(folder: Path, per_rank: tuple[int, ...]) -> None:
    """Each rank: half of every split parameter plus all of the replicated ones, exactly."""
    model, _ = load_model(str(folder), dtype="float32")
    total = resident_bytes(model)
    assert total is not None
    split = sum(p.nbytes for n, p in model.named_parameters() if any(s in n for s in SPLIT))
    assert per_rank == ((total + (total - split)) // 2,) * 2
    assert max(per_rank) < 0.55 * total
