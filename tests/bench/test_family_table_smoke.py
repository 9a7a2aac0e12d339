"""scripts/family_table.py at its tiny scale on the cpu backend: every row served, matching
transformers and hitting the cache, with rates measured; the JSON holds the same rows; a
backend that cannot start a model gets a "refused" row. (Marked slow: the MLX and llama.cpp
rows.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "family_table.py"
FAMILIES = ["llama", "mixtral", "qwen3_5"]  # dense, experts, recurrent (state snapshots)


def _script():
    if "family_table" not in sys.modules:
        spec = importlib.util.spec_from_file_location("family_table", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["family_table"] = module
        spec.loader.exec_module(module)
    return sys.modules["family_table"]


def test_tiny_table_on_cpu(tmp_path, capsys):
    out = tmp_path / "table.json"
    args = ["--scale", "tiny", "--families", ",".join(FAMILIES), "--backends", "cpu"]
    rows = _script().main([*args, "--repeats", "1", "--out", str(out)])
    assert [(r.family, r.backend) for r in rows] == [(f, "cpu") for f in FAMILIES]
    for r in rows:
        assert r.parity == "yes", r
        assert r.cache_hit.startswith("yes (") and int(r.cache_hit[5:].split()[0]) > 0, r
        assert r.prefill_tps > 0 and r.decode_tps > 0, r
        assert 100_000 < r.params < 400_000, r
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| family | params | backend | parity | cache hit")
    assert [line.split(" | ")[:4] for line in table[2:]] == [
        ["| " + r.family, f"{r.params / 1e3:.0f}k", "cpu", "yes"] for r in rows
    ]
    saved = json.loads(out.read_text())
    assert saved["setup"]["scale"] == "tiny"
    assert [(r["family"], r["parity"], r["cache_hit"]) for r in saved["rows"]] == [
        (r.family, r.parity, r.cache_hit) for r in rows
    ]


@pytest.mark.slow
def test_tiny_table_on_mlx_and_llamacpp(tmp_path):
    """The other backends' rows: MLX on the same folder, llama.cpp on the converted GGUF twin
    (its own tokenizer and vocabulary) in a child process."""
    pytest.importorskip("mlx.core")
    pytest.importorskip("llama_cpp")
    args = ["--scale", "tiny", "--families", "qwen3_moe", "--backends", "mlx,llamacpp"]
    rows = _script().main([*args, "--repeats", "1"])
    assert [(r.backend, r.parity) for r in rows] == [("mlx", "yes"), ("llamacpp", "yes")]
    assert all(r.cache_hit.startswith("yes (") and r.decode_tps > 0 for r in rows), rows
    assert rows[1].params > 10 * rows[0].params  # the GGUF twin's 49,152-token vocabulary


def test_a_backend_that_refuses_gets_a_refused_row(monkeypatch):
    script = _script()

    def refuse(*args, **kwargs):
        raise ValueError("the MLX backend does not implement\nsomething (Family)")

    monkeypatch.setattr(script, "Engine", refuse)
    rows = script.main(["--scale", "tiny", "--families", "llama", "--backends", "mlx"])
    assert [(r.backend, r.parity, r.prefill_tps) for r in rows] == [
        ("mlx", "refused: the MLX backend does not implement something (Family)", None)
    ]
