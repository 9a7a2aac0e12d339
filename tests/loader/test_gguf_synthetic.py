"""Tiny GGUF files (written like llama.cpp does) load into the same model transformers holds."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from localradix.loader import (
    gguf_convert,
    load_model,
    load_model_config,
    resolve_model,
)
from localradix.loader.gguf_convert import WEIGHTS_FILE, cache_dir_for
from localradix.model_api.attention import get_attention_backend
from localradix.step import ForwardBatch

from .conftest import byte_level_vocab, gguf, write_gguf

transformers = pytest.importorskip("transformers")
VOCAB = len(byte_level_vocab()[0])
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)


def _hf_model(arch: str) -> torch.nn.Module:
    t = transformers
    config = {
        "llama": lambda: t.LlamaConfig(**COMMON),
        "qwen2": lambda: t.Qwen2Config(**COMMON, tie_word_embeddings=False),
        "qwen3": lambda: t.Qwen3Config(**COMMON, tie_word_embeddings=True),
    }[arch]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


def _quant_roundtrip(model: torch.nn.Module) -> None:
    """What the model becomes after Q8_0 quantization of its matrices."""
    qtype = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 2:
                q = gguf.quants.quantize(p.numpy(), qtype)
                p.copy_(torch.from_numpy(gguf.quants.dequantize(q, qtype)).reshape(p.shape))


def _logits(model: torch.nn.Module, config, ids: list[int]) -> torch.Tensor:
    attn = get_attention_backend("torch_native").from_model_config(config, 64, model.dtype, "cpu")
    batch = ForwardBatch.build([np.array(ids)], [np.arange(1, len(ids) + 1)], [0])
    attn.prepare(batch)
    with torch.inference_mode():
        hidden = model(torch.from_numpy(batch.input_ids), torch.from_numpy(batch.positions), attn)
        return model.compute_logits(hidden)


@pytest.mark.parametrize(
    ("arch", "quant", "converted"),
    [
        ("llama", None, False),
        ("llama", "Q8_0", False),
        ("llama", "Q8_0", True),
        ("qwen2", None, False),
        ("qwen3", None, False),
    ],
)
def test_gguf_model_matches_transformers(tmp_path, cache_dir, monkeypatch, arch, quant, converted):
    if converted:  # the path of models too big to dequantize at every start
        monkeypatch.setattr(gguf_convert, "DIRECT_LOAD_MAX_PARAMS", 0)
    hf = _hf_model(arch)
    path = write_gguf(tmp_path / f"{arch}.gguf", hf, arch, quant)
    if quant:
        _quant_roundtrip(hf)
    model, config = load_model(str(path), "float32")
    assert config.model_type == arch
    assert config.tie_word_embeddings == hf.config.tie_word_embeddings
    ids = [5, 77, 3, 200, 150, 9, 41, 260, 13, 99]
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(_logits(model, config, ids), ref, atol=1e-4, rtol=0)
    assert (cache_dir_for(path) / WEIGHTS_FILE).exists() == converted


def test_small_models_leave_no_weights_on_disk(tmp_path, cache_dir):
    path = write_gguf(tmp_path / "m.gguf", _hf_model("llama"), "llama", "Q8_0")
    load_model(str(path), "float32")
    files = {f.name for f in cache_dir_for(path).iterdir()}
    assert files == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }


def test_conversion_is_cached_and_keyed_by_file(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(gguf_convert, "DIRECT_LOAD_MAX_PARAMS", 0)
    path = write_gguf(tmp_path / "m.gguf", _hf_model("llama"), "llama")
    config = load_model_config(str(path))  # metadata only: no weights converted yet
    folder = cache_dir_for(path)
    assert folder.parent.parent == cache_dir and not (folder / WEIGHTS_FILE).exists()
    assert config.num_hidden_layers == 2 and config.head_dim == 16
    load_model(str(path))
    stamp = (folder / WEIGHTS_FILE).stat().st_mtime_ns
    load_model(str(path))
    assert (folder / WEIGHTS_FILE).stat().st_mtime_ns == stamp, "second load must not reconvert"
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    assert cache_dir_for(path) != folder, "a changed file gets a new cache entry"


def test_gguf_tokenizer(tmp_path, cache_dir):
    """The tokenizer rebuilt from GGUF metadata (what runs without llama.cpp, for the
    vocabularies it reproduces exactly) against transformers' own GGUF reader."""
    from localradix.loader.gguf_convert import ensure_gguf_tokenizer
    from localradix.loader.tokenizer import Tokenizer

    path = write_gguf(tmp_path / "m.gguf", _hf_model("qwen3"), "qwen3")
    tok = Tokenizer.from_folder(ensure_gguf_tokenizer(path))
    assert tok.eos_token_ids == (2,) and tok.bos_token_id == 1 and tok.vocab_size == VOCAB
    ids = tok.encode("<|im_start|>the hello world<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.convert_ids_to_tokens(ids[:3]) == ["<|im_start|>", "t", "he"]
    assert tok.convert_ids_to_tokens(tok.encode(" the hello")) == ["Ġthe", "Ġ", "he", "llo"]
    assert tok.decode(ids) == "the hello world"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>the hello world<|im_end|>"
    for text in ["héllo wörld 🙂", "  spaces\n\ttabs", ""]:
        assert tok.decode(tok.encode(text)) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    for text in ["the hello world", "hello\n\nthe  end", "<|im_start|>x<|im_end|>", "é🙂"]:
        assert tok.encode(text) == reference.encode(text, add_special_tokens=False), text


def test_load_tokenizer_imports_no_torch(tmp_path, cache_dir):
    path = write_gguf(tmp_path / "m.gguf", _hf_model("llama"), "llama")
    code = (
        "import sys; from localradix.loader import load_tokenizer, load_model_config, resolve_model; "
        f"t = load_tokenizer({str(path)!r}); c = load_model_config(resolve_model({str(path)!r})); "
        "assert t.encode('hello') and c.num_hidden_layers == 2; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_resolve_gguf_in_folder(tmp_path, cache_dir):
    path = write_gguf(tmp_path / "only.gguf", _hf_model("llama"), "llama")
    source = resolve_model(str(tmp_path))
    assert source.kind == "gguf" and source.path == path and source.name == "only"
