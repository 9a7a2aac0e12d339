"""`localradix bench --launch` against the real server (slow; skipped until it exists)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from localradix.bench import run_bench
from localradix.bench.options import build_parser


def _server_missing() -> bool:
    try:
        return any(
            importlib.util.find_spec(m) is None
            for m in ("localradix.server.app", "localradix.__main__")
        )
    except ImportError:
        return True


@pytest.mark.slow
@pytest.mark.skipif(_server_missing(), reason="localradix server not available yet")
def test_launch_localradix_with_and_without_radix_cache(tmp_path):
    out = tmp_path / "r.json"
    args = [
        "--compare", "launch:", "nocache=launch:--disable-radix-cache",
        "--workload", "agent", "chat", "--scale", "0.1", "--system-tokens", "300",
        "--prompt-tokens", "16", "--max-tokens", "8", "--concurrency", "4",
        "--launch-timeout", "300", "--request-timeout", "300", "--output", str(out),
        "--no-progress",
    ]  # fmt: skip
    rc = run_bench(build_parser().parse_args(args))
    doc = json.loads(out.read_text())
    for run in doc["runs"]:
        assert run["requests"]["errors"] == 0, (run["label"], run["error_counts"], run["fatal"])
        tok = run["tokens"]
        assert tok["requests_with_usage"] == run["requests"]["total"]
        # a detokenizer may hold back partial characters, so chunks <= tokens
        assert 0 < tok["output_from_stream"] <= tok["output_from_usage"] == tok["output"]
        for key in ("ttft_s", "itl_s", "latency_s"):
            d = run[key]
            assert d["min"] <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"]
    assert rc == 0
    cached = {(r["label"], r["workload"]["name"]): r["cached_share"] for r in doc["runs"]}
    assert cached[("localradix", "agent")] > 0.3
    assert not cached[("nocache", "agent")]  # 0 or not reported
    assert len(doc["comparisons"]) == 2
