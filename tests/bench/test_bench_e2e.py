"""`localradix bench` launching the real server, with and without its radix cache (slow;
skipped while the server cannot start)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from localradix.bench import run_bench
from localradix.bench.options import build_parser
from localradix.bench.workloads import WORKLOADS


def _server_missing() -> bool:
    try:
        return any(
            importlib.util.find_spec(m) is None
            for m in ("localradix.server.app", "localradix.__main__")
        )
    except ImportError:
        return True


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(_server_missing(), reason="localradix server not available yet")
def test_every_workload_with_and_without_radix_cache(tmp_path):
    out = tmp_path / "r.json"
    args = [
        "--compare", "launch:", "nocache=launch:--disable-radix-cache",
        "--workload", "all", "--num-requests", "2", "--num-conversations", "1", "--turns", "2",
        "--num-docs", "1", "--questions-per-doc", "2", "--system-tokens", "200",
        "--doc-tokens", "200", "--prompt-tokens", "16", "--max-tokens", "4",
        "--concurrency", "1", "--warmup", "1", "--launch-timeout", "300",
        "--request-timeout", "300", "--output", str(out), "--no-progress",
    ]  # fmt: skip
    rc = run_bench(build_parser().parse_args(args))
    doc = json.loads(out.read_text())
    assert len(doc["runs"]) == 2 * len(WORKLOADS)
    for run in doc["runs"]:
        assert run["requests"]["errors"] == 0, (run["label"], run["error_counts"], run["fatal"])
        tok = run["tokens"]
        assert tok["requests_with_usage"] == tok["requests_with_cached"] == 2
        # the detokenizer may hold back a partial character, so chunks <= tokens
        assert 0 < tok["output_from_stream"] <= tok["output_from_usage"] == tok["output"]
        for key in ("ttft_s", "itl_s", "latency_s"):
            d = run[key]
            assert d["min"] <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"]
    assert rc == 0
    cached = {(r["label"], r["workload"]["name"]): r["cached_share"] for r in doc["runs"]}
    for name in ("agent", "chat", "rag"):  # the second request reuses the first one's prefix
        assert cached[("localradix", name)] > 0.25
        assert cached[("nocache", name)] == 0
    assert len(doc["comparisons"]) == len(WORKLOADS)
