"""Report arithmetic on hand-made results: percentiles, totals, rates, ratios, tables."""

from __future__ import annotations

import random

import numpy as np
import pytest

from localradix.bench.client import RequestResult
from localradix.bench.report import (
    comparisons,
    distribution,
    failed_run,
    percentile,
    summarize,
)
from localradix.bench.runner import RunResult
from localradix.bench.table import format_comparisons, format_runs
from localradix.bench.workloads import Sizes, build_workload


def test_percentile_matches_numpy_and_is_monotonic():
    rng = random.Random(0)
    for n in (1, 2, 3, 10, 101):
        v = sorted(rng.random() for _ in range(n))
        for p in (0, 50, 90, 99, 100):
            assert percentile(v, p) == pytest.approx(float(np.percentile(v, p)))
        d = distribution(v)
        assert d["min"] <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"]
        assert d["n"] == n


def test_distribution_of_nothing():
    d = distribution([])
    assert d["n"] == 0 and d["p50"] is None and d["mean"] is None


def _result(session, ttft, chunks, usage=True, cached=None, error=None):
    r = RequestResult(session=session, turn=0, start=100.0)
    r.ttft, r.chunk_times, r.error = ttft, chunks, error
    r.latency = (chunks[-1] + 0.01) if chunks else 0.5
    if usage:
        r.prompt_tokens, r.output_tokens, r.cached_tokens = 100, len(chunks), cached
    return r


def test_summarize_totals_rates_and_shares():
    wl = build_workload("random", Sizes(num_requests=4))
    results = [
        _result(0, 0.1, [0.1, 0.2, 0.3], cached=50),
        _result(1, 0.2, [0.2, 0.25], cached=0),
        _result(2, 0.3, [0.3, 0.4, 0.5, 0.6], usage=False),
        _result(3, None, [], error="HTTP 500: boom"),
    ]
    rep = summarize(RunResult(results, 2.0, "t", 4, t0=100.0), wl, {"label": "x"})
    assert rep["requests"] == {"total": 4, "ok": 3, "errors": 1}
    assert rep["tokens"]["output"] == 9
    assert rep["tokens"]["output_from_usage"] == 5
    assert rep["tokens"]["output_from_stream"] == 9
    assert rep["tokens"]["prompt"] == 200
    assert rep["cached_share"] == pytest.approx(50 / 200)
    assert rep["requests_per_s"] == pytest.approx(1.5)
    assert rep["output_tokens_per_s"] == pytest.approx(4.5)
    assert rep["ttft_s"]["n"] == 3 and rep["ttft_s"]["p50"] == pytest.approx(0.2)
    assert rep["itl_s"]["n"] == 2 + 1 + 3
    assert rep["itl_s"]["max"] == pytest.approx(0.1)
    assert rep["tpot_s"]["n"] == 3
    assert rep["tpot_s"]["p50"] == pytest.approx(0.1)
    assert rep["error_counts"] == {"HTTP 500: boom": 1}
    assert rep["per_request"][0]["start_s"] == 0.0


def test_failed_run_counts_every_request_as_error():
    wl = build_workload("chat", Sizes(num_conversations=2, turns=3))
    rep = failed_run(wl, {"label": "down"}, "launch failed: boom")
    assert rep["requests"] == {"total": 6, "ok": 0, "errors": 6}
    assert rep["fatal"] == "launch failed: boom"
    assert rep["requests_per_s"] is None
    assert "down" in format_runs([rep])


def test_comparisons_and_tables():
    wl = build_workload("random", Sizes(num_requests=2))

    def run(label, wall, ttft):
        results = [_result(i, ttft, [ttft, ttft + 0.1], cached=10) for i in range(2)]
        return summarize(RunResult(results, wall, "t", 2), wl, {"label": label})

    runs = [run("a", 2.0, 0.2), run("b", 1.0, 0.1), run("c", 4.0, 0.4)]
    comps = comparisons(runs)
    assert [c["target"] for c in comps] == ["b", "c"]
    assert comps[0]["ratios"]["output_tokens_per_s"] == pytest.approx(2.0)
    assert comps[0]["ratios"]["ttft_s.p50"] == pytest.approx(0.5)
    assert comps[1]["ratios"]["wall_time_s"] == pytest.approx(2.0)
    assert comparisons(runs, baseline="c")[0]["baseline"] == "c"
    assert comparisons(runs[:1]) == []
    text = format_runs(runs) + format_comparisons(comps)
    for word in ("workload random", "TTFT p50/p90/p99", "2.00x", "0.50x", "10.0%"):
        assert word in text
