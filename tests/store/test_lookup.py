"""Names to models: aliases (derived and user-given), REPO:QUANT, REPO, and resolve_model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localradix.loader import ModelSourceError, resolve_model
from localradix.store import StoreError
from localradix.store.aliases import set_alias
from localradix.store.catalog import scan
from localradix.store.lookup import find_entry

SHA = "0" * 40


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache and localradix cache (the bundled model still found installed)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("LOCALRADIX_CACHE_DIR", str(tmp_path / "lr"))
    return tmp_path / "hub"


def put(store: Path, repo: str, files: dict[str, bytes]) -> Path:
    """Files in a snapshot the way the hub writes them: blobs and relative links."""
    folder = store / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / SHA
    for i, (name, data) in enumerate(files.items()):
        blob = folder / "blobs" / f"blob{i}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(blob)
    return snapshot


def test_the_bundled_model_is_always_listed(store):
    (entry,) = scan()
    assert entry.ref == "bundled" and entry.alias == "smollm2:135m-q4_1"
    assert find_entry("SmolLM2-135M-Instruct") == entry == find_entry("BUNDLED")


def test_gguf_quants_and_folders_by_every_name(store):
    put(store, "org/Coder-7B-GGUF", {"Coder-7B-Q4_K_M.gguf": b"x", "Coder-7B-Q8_0.gguf": b"y"})
    folder = put(store, "org/Coder-7B", {"config.json": b'{"torch_dtype": "bfloat16"}',
                                          "model.safetensors": b"w"})  # fmt: skip
    assert [e.ref for e in scan()] == [
        "bundled", "org/Coder-7B", "org/Coder-7B-GGUF:Q4_K_M", "org/Coder-7B-GGUF:Q8_0",
    ]  # fmt: skip
    assert find_entry("coder:7b-q8_0").ref == "org/Coder-7B-GGUF:Q8_0"
    assert find_entry("org/coder-7b-gguf:q4_k_m").ref == "org/Coder-7B-GGUF:Q4_K_M"
    assert find_entry("org/Coder-7B-GGUF:q8").ref == "org/Coder-7B-GGUF:Q8_0"
    assert find_entry("coder:7b-bf16").path == folder
    assert find_entry("nothing:here") is None
    with pytest.raises(StoreError, match=r"'org/Coder-7B-GGUF' matches 2 models \(org/Coder"):
        find_entry("org/Coder-7B-GGUF")


def test_resolve_model_serves_store_names(store):
    put(store, "org/Coder-7B-GGUF", {"Coder-7B-Q4_K_M.gguf": b"x"})
    source = resolve_model("coder:7b-q4_k_m")
    assert source.kind == "gguf" and source.path.name == "Coder-7B-Q4_K_M.gguf"
    assert source.name == "coder:7b-q4_k_m"  # served under the name the user gave
    assert resolve_model("org/Coder-7B-GGUF").path == source.path
    bundled = resolve_model("smollm2:135m-q4_1")
    assert bundled.path == resolve_model(None).path
    with pytest.raises(ModelSourceError, match="`localradix pull ORG/NAME:QUANT`"):
        resolve_model("coder:13b")


def test_user_aliases_win_and_are_kept_in_a_json_file(store, tmp_path):
    put(store, "org/Coder-7B-GGUF", {"Coder-7B-Q4_K_M.gguf": b"x"})
    set_alias("Coder", "org/Coder-7B-GGUF:Q4_K_M")
    saved = json.loads((tmp_path / "lr" / "aliases.json").read_text())
    assert saved == {"coder": "org/Coder-7B-GGUF:Q4_K_M"}
    assert find_entry("CODER").ref == "org/Coder-7B-GGUF:Q4_K_M"
    with pytest.raises(StoreError, match="not a usable alias"):
        set_alias("org/x", "bundled")


def test_a_split_model_missing_a_shard_is_not_listed(store):
    put(store, "org/Big-GGUF", {"Big-70B-Q4_K_M-00001-of-00002.gguf": b"x"})
    assert [e.ref for e in scan()] == ["bundled"]


def test_encoders_in_the_hub_cache_are_not_listed(store):
    config = json.dumps({"architectures": ["BertModel"]}).encode()
    put(store, "org/bert", {"config.json": config, "model.safetensors": b"w"})
    config = json.dumps({"architectures": ["Qwen2ForCausalLM"]}).encode()
    put(store, "org/Qwen-1B", {"config.json": config, "model.safetensors": b"w"})
    assert [e.ref for e in scan()] == ["bundled", "org/Qwen-1B"]
