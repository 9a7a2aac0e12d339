"""Our decoder (through the torch-native attention backend) against transformers, in fp32."""

from __future__ import annotations

import pytest
import torch

from localradix.loader import load_model

from .conftest import ARCHS

ATOL = 1e-4


@pytest.fixture(scope="module")
def loaded(hf_checkpoints):
    """name -> (our model, config, the transformers model)."""
    out = {}
    for name, (folder, hf_model) in hf_checkpoints.items():
        model, config = load_model(str(folder), "float32", "cpu")
        out[name] = (model, config, hf_model)
    return out


def _reference(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(torch.tensor([ids])).logits[0].float()


def _prompt(length: int, seed: int) -> list[int]:
    return torch.randint(0, 160, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_full_sequence_matches_transformers(loaded, make_stepper, arch):
    model, config, hf_model = loaded[arch]
    ids = _prompt(24, seed=1)
    ours = make_stepper(model, config).step({"a": ids})["a"]
    torch.testing.assert_close(ours, _reference(hf_model, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_extend_decode_matches_full_pass(loaded, make_stepper, arch):
    model, config, hf_model = loaded[arch]
    ids = _prompt(20, seed=2)
    full = _reference(hf_model, ids)
    stepper = make_stepper(model, config)
    pieces = [stepper.step({"a": ids[:7]})["a"], stepper.step({"a": ids[7:15]})["a"]]
    pieces += [stepper.step({"a": [t]})["a"] for t in ids[15:]]
    torch.testing.assert_close(torch.cat(pieces), full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_mixed_batch_matches_separate_full_passes(loaded, make_stepper, arch):
    model, config, hf_model = loaded[arch]
    seqs = {
        name: _prompt(n, seed=10 + i)
        for i, (name, n) in enumerate(zip("abcde", (9, 14, 6, 17, 11), strict=True))
    }
    stepper = make_stepper(model, config)
    got = {name: [] for name in seqs}
    # Round 1: three prefills of different lengths in one batch.
    for name, logits in stepper.step(
        {"a": seqs["a"][:6], "b": seqs["b"][:10], "c": seqs["c"]}
    ).items():
        got[name].append(logits)
    # Round 2: decodes interleaved with a fresh prefill and an extend on a cached prefix.
    round2 = {"a": seqs["a"][6:7], "d": seqs["d"][:12], "b": seqs["b"][10:14]}
    for name, logits in stepper.step(round2).items():
        got[name].append(logits)
    # Rounds 3+: decode-only batches of different lengths (padding + mask), plus one newcomer.
    for name, logits in stepper.step(
        {"a": seqs["a"][7:8], "d": seqs["d"][12:13], "e": seqs["e"]}
    ).items():
        got[name].append(logits)
    for name, logits in stepper.step({"d": seqs["d"][13:14], "a": seqs["a"][8:9]}).items():
        got[name].append(logits)
    for t in seqs["d"][14:]:
        got["d"].append(stepper.step({"d": [t]})["d"])
    for name, ids in seqs.items():
        torch.testing.assert_close(
            torch.cat(got[name]), _reference(hf_model, ids), atol=ATOL, rtol=0
        )


def test_tied_embeddings_share_storage(loaded):
    model, config, _ = loaded["llama_tied"]
    assert config.tie_word_embeddings and model.lm_head is None
    assert loaded["llama"][0].lm_head is not None


def test_bf16_model_runs_and_stays_close(hf_checkpoints, make_stepper):
    folder, hf_model = hf_checkpoints["llama"]
    model, config = load_model(str(folder), "bfloat16", "cpu")
    assert model.embed_tokens.dtype == torch.bfloat16
    ids = _prompt(12, seed=3)
    ours = make_stepper(model, config).step({"a": ids})["a"]
    assert ours.dtype == torch.float32
    ref = _reference(hf_model, ids)
    assert (ours - ref).abs().max() < 0.1 * ref.abs().max()
