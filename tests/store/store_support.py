"""The store tests' helpers: the hub stand-in's repos (built from the bundled GGUF and tiny
random-weight models) and the `localradix` CLI run as a user runs it (a subprocess) against
the stand-in. Imported by name (`from store_support import ...`); a bare `from conftest
import` would pick whichever folder's conftest was imported first."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_standin import HubStandIn

REPO = Path(__file__).resolve().parents[2]
GGUF_REPO = "test-org/SmolLM2-135M-Instruct-GGUF"
SPLIT_REPO = "test-org/Tiny-2M-GGUF"
FOLDER_REPO = "test-org/tiny-llama-1M"
EMPTY_REPO = "test-org/no-model"
ENCODER_REPO = "test-org/bert-tiny"
SHARDS = ("Tiny-2M-Q8_0-00001-of-00002.gguf", "Tiny-2M-Q8_0-00002-of-00002.gguf")


def bundled_gguf() -> Path:
    from localradix.store.bundled import ensure_bundled

    return ensure_bundled()


def write_split_gguf(folder: Path) -> list[Path]:
    """Two shards of a tiny model, each a whole GGUF with llama.cpp's split.* keys."""
    import numpy as np

    gguf = pytest.importorskip("gguf")
    paths = []
    for i, name in enumerate(SHARDS):
        w = gguf.GGUFWriter(str(folder / name), "llama")
        w.add_uint16("split.no", i)
        w.add_uint16("split.count", len(SHARDS))
        if i == 0:
            w.add_context_length(512)
            w.add_block_count(1)
        size = 65536 if i == 0 else 3 << 20  # the second shard (12 MiB) outlasts a 10 MiB chunk
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.full(size, i + 1, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(folder / name)
    return paths


def write_tiny_folder(folder: Path) -> dict[str, Path]:
    """A random-weight Llama folder as the hub holds one, with files a model does not need."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = transformers.LlamaConfig(
        vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
    )  # fmt: skip
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate("abcdefghijklm")}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (folder / "README.md").write_text("# tiny\n")
    (folder / "pytorch_model.bin").write_bytes(b"not needed: safetensors are there")
    (folder / "onnx").mkdir()
    (folder / "onnx" / "model.onnx").write_bytes(b"not needed")
    return {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}


def write_encoder_folder(folder: Path) -> dict[str, Path]:
    """A repo of an encoder (config.json and weights, but nothing that generates text)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    (folder / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    return {p.name: p for p in folder.iterdir()}


def store_env(home: Path, hub: HubStandIn) -> dict[str, str]:
    """A user's environment: the hub at the stand-in, an empty cache in `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LOCALRADIX_"))}
    env.update(
        HF_HOME=str(home / "hf"),
        HF_ENDPOINT=hub.url,
        HF_HUB_DISABLE_TELEMETRY="1",
        LOCALRADIX_CACHE_DIR=str(home / "localradix"),
        PYTHONPATH=str(REPO),
    )
    return env


def cli(env: dict[str, str], *args: str, stdin: str = "", timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "localradix", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def files_under(folder: Path) -> set[str]:
    return (
        {p.relative_to(folder).as_posix() for p in folder.rglob("*")} if folder.exists() else set()
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(
    env: dict[str, str], model: str | None, log: Path, *flags: str
) -> tuple[subprocess.Popen, str]:
    """`localradix serve [MODEL] [FLAGS]` in the background, once /health answers 200."""
    import httpx

    port = free_port()
    command = ["serve", *([model] if model else []), *flags, "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localradix", *command],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise AssertionError(f"serve did not become healthy:\n{log.read_text()}")
