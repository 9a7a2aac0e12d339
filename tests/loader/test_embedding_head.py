"""Which Hugging Face folders are embedding models, and how they pool (no weights loaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from localradix.loader.embedding import EmbeddingHead, embedding_head, is_bare_model
from localradix.store.source import ModelSource

ST = "sentence_transformers.models."


def _folder(tmp: Path, arch: str, tied: bool, weights: list[str], modules=None, pooling=None):
    tmp.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [arch], "model_type": "qwen3", "tie_word_embeddings": tied}
    (tmp / "config.json").write_text(json.dumps(config))
    save_file({name: torch.zeros(2) for name in weights}, str(tmp / "model.safetensors"))
    if modules is not None:
        (tmp / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (tmp / "1_Pooling").mkdir()
        (tmp / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return ModelSource(tmp, "hf", tmp.name)


def _st(*kinds: str) -> list[dict]:
    return [
        {"idx": i, "path": "1_Pooling" if k == "Pooling" else "", "type": ST + k}
        for i, k in enumerate(kinds)
    ]


def test_a_causal_lm_is_not_an_embedding_model(tmp_path):
    source = _folder(tmp_path, "Qwen3ForCausalLM", False, ["model.norm.weight", "lm_head.weight"])
    assert embedding_head(source) is None and not is_bare_model(source.path)


@pytest.mark.parametrize(
    ("arch", "tied", "weights"),
    [
        ("Qwen3Model", False, ["norm.weight"]),  # the config names the bare model
        ("LlamaForCausalLM", False, ["model.norm.weight"]),  # untied, and no lm_head
    ],
)
def test_a_bare_decoder_pools_its_last_token_normalised(tmp_path, arch, tied, weights):
    source = _folder(tmp_path, arch, tied, weights)
    assert embedding_head(source) == EmbeddingHead("last", True)


def test_sentence_transformers_files_say_how_to_pool(tmp_path):
    mean = {"pooling_mode_mean_tokens": True, "pooling_mode_lasttoken": False}
    source = _folder(
        tmp_path / "a",
        "Qwen3ForCausalLM",
        True,
        ["norm.weight"],
        _st("Transformer", "Pooling"),
        mean,
    )
    assert embedding_head(source) == EmbeddingHead("mean", False)
    last = {"pooling_mode_lasttoken": True}
    modules = _st("Transformer", "Pooling", "Normalize")
    source = _folder(tmp_path / "b", "Qwen3ForCausalLM", True, ["norm.weight"], modules, last)
    assert embedding_head(source) == EmbeddingHead("last", True)


def test_an_unsupported_pooling_is_not_embedded_wrongly(tmp_path):
    cls = {"pooling_mode_cls_token": True}
    source = _folder(
        tmp_path, "Qwen3Model", False, ["norm.weight"], _st("Transformer", "Pooling"), cls
    )
    assert embedding_head(source) is None


def test_a_gguf_does_not_embed(tmp_path):
    assert embedding_head(ModelSource(tmp_path / "m.gguf", "gguf", "m")) is None
