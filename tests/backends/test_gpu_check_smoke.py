"""scripts/gpu_check.py --smoke: the GPU check's parity and benchmark code, on the CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def test_gpu_check_smoke_runs_on_cpu(tmp_path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--hbm-gbps", "20", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[PASS] fp32 greedy vs transformers" in done.stdout
    assert "roofline batch 1:" in done.stdout and "prefill 64 tokens" in done.stdout
    assert done.stdout.startswith("versions: python") and "copy bandwidth:" in done.stdout
    assert "mixed decode 4 requests" in done.stdout and "extend 32 over a cached 64" in done.stdout
    result = json.loads(out.read_text())
    assert result["failed"] == [] and result["checks"]["fp32 greedy vs transformers"]
    assert set(result["numbers"]) >= {"decode_b1_tok_s", "decode_b4_tok_s", "roofline_b1"}
    assert result["numbers"]["extend_over_prefix"]["slowdown"] > 0
    assert result["numbers"]["versions"]["torch"] and result["numbers"]["copy_gbps"] > 0
    served = result["numbers"]["served_decode_b4_tok_s"]
    assert served["plain"] > 0 and served["overlap"] > 0
    assert "served decode batch   4:" in done.stdout
    assert result["skipped"] == ["bf16 FlashInfer parity (needs CUDA)"]


def test_slots_refuse_to_run_past_the_kv_pool(monkeypatch):
    """The H200 run hit a CUDA index assert when batch 128's slots ran past a 32k pool: the
    check now sizes its pool for the largest batch, and its slot maker says so if not."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", gpu_check)  # its dataclasses look it up
    spec.loader.exec_module(gpu_check)
    slots = gpu_check.Slots(page_size=4, capacity=16)
    slots.batch({"a": list(range(8))})  # slots 4..11: page 0 is the pool's padding page
    with pytest.raises(RuntimeError, match="holds 16 tokens"):
        slots.batch({"b": list(range(8))})


def _load_gpu_check(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", gpu_check)  # its dataclasses look it up
    spec.loader.exec_module(gpu_check)
    return gpu_check


def test_gpu_check_reports_sampling_inside_the_graph(monkeypatch, tiny_model):
    """The check's graph-sampling step over fake FlashInfer and fake graphs (which run the
    captured step eagerly): it must see every decode step sampled in the graph."""
    import torch

    from localradix.backends.cuda.attention import FlashInferAttention
    from localradix.backends.cuda.runner import DeviceRunner
    from localradix.config import ServerArgs
    from localradix.loader import load_model

    from .conftest import VOCAB
    from .gpu_fakes import FakeFlashInfer, FakeGraphApi

    fake = FakeFlashInfer()
    monkeypatch.setitem(sys.modules, "flashinfer", fake.module())
    monkeypatch.setattr(FlashInferAttention, "workspace_bytes", 1024)
    gpu_check = _load_gpu_check(monkeypatch)
    folder, _ = tiny_model("llama")
    model, config = load_model(str(folder), "float16", "cpu")
    args = ServerArgs(max_total_tokens=1023, max_running_requests=8, context_length=128)
    api = FakeGraphApi(fake)
    runner = DeviceRunner(model, config, args, "cpu", torch.float16, "flashinfer", graph_api=api)
    report = gpu_check.Report()
    gpu_check.check_graph_sampling(runner, VOCAB, report, steps=4)
    assert report.checks == {"sampling inside the CUDA graph": True}
    assert report.numbers["graph_sampling"] == {"in_graph": True, "steps": 4, "equal": 4}
