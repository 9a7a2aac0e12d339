"""Turn timed results into the report: one JSON-able dict per run, a table, compare ratios.

Throughput and latency count successful requests only; failed ones are counted in `requests`
and `error_counts`. Output tokens come from the server's usage when reported, otherwise from
the content chunks seen in the stream.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from localradix.bench.client import RequestResult
from localradix.bench.runner import RunResult
from localradix.bench.workloads import Workload

PERCENTILES = (50, 90, 99)
MAX_ERRORS_LISTED = 20


def percentile(sorted_values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    k = (len(sorted_values) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def distribution(values: list[float]) -> dict[str, float | int | None]:
    """n, mean, min, p50, p90, p99, max of `values` (None entries when empty)."""
    v = sorted(values)
    out: dict[str, float | int | None] = {"n": len(v)}
    out["mean"] = sum(v) / len(v) if v else None
    out["min"] = v[0] if v else None
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(v, p) if v else None
    out["max"] = v[-1] if v else None
    return out


def output_tokens(r: RequestResult) -> int:
    return r.output_tokens if r.output_tokens is not None else r.stream_tokens


def tpot(r: RequestResult) -> float | None:
    """Mean time per output token after the first."""
    n = output_tokens(r)
    if r.ttft is None or n < 2 or not r.chunk_times:
        return None
    return (r.chunk_times[-1] - r.ttft) / (n - 1)


def summarize(run: RunResult, workload: Workload, target: dict[str, Any]) -> dict[str, Any]:
    ok = [r for r in run.results if r.ok]
    tokens = _token_totals(ok)
    out_tokens = sum(output_tokens(r) for r in ok)
    wall = run.wall_time
    rate = (lambda x: x / wall) if wall > 0 else (lambda x: None)
    return {
        "label": target.get("label"),
        "target": target,
        "workload": {
            "name": workload.name,
            "params": workload.params,
            "num_requests": workload.num_requests,
            "num_sessions": len(workload.sessions),
        },
        "concurrency": run.concurrency,
        "started_at": run.started_at,
        "wall_time_s": wall,
        "requests": {
            "total": len(run.results),
            "ok": len(ok),
            "errors": len(run.results) - len(ok),
        },
        "requests_per_s": rate(len(ok)),
        "output_tokens_per_s": rate(out_tokens),
        "total_tokens_per_s": rate(out_tokens + (tokens["prompt"] or 0)),
        "tokens": tokens,
        "cached_share": _cached_share(ok),
        "ttft_s": distribution([r.ttft for r in ok if r.ttft is not None]),
        "itl_s": distribution([g for r in ok for g in r.gaps]),
        "tpot_s": distribution([t for r in ok if (t := tpot(r)) is not None]),
        "latency_s": distribution([r.latency for r in ok if r.latency is not None]),
        "error_counts": dict(Counter(r.error for r in run.results if r.error)),
        "errors": [
            {"session": r.session, "turn": r.turn, "error": r.error} for r in run.results if r.error
        ][:MAX_ERRORS_LISTED],
        "fatal": None,
        "per_request": [_request_record(r, run.t0) for r in run.results],
    }


def _token_totals(ok: list[RequestResult]) -> dict[str, int | None]:
    with_usage = [r for r in ok if r.output_tokens is not None]
    with_prompt = [r for r in ok if r.prompt_tokens is not None]
    with_cached = [r for r in ok if r.cached_tokens is not None]
    return {
        "output": sum(output_tokens(r) for r in ok),
        "output_from_usage": sum(r.output_tokens or 0 for r in with_usage) if with_usage else None,
        "output_from_stream": sum(r.stream_tokens for r in ok),
        "prompt": sum(r.prompt_tokens or 0 for r in with_prompt) if with_prompt else None,
        "cached": sum(r.cached_tokens or 0 for r in with_cached) if with_cached else None,
        "requests_with_usage": len(with_usage),
        "requests_with_cached": len(with_cached),
    }


def _cached_share(ok: list[RequestResult]) -> float | None:
    """Cached prompt tokens / prompt tokens, over requests that report both."""
    both = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    prompt = sum(r.prompt_tokens or 0 for r in both)
    return sum(r.cached_tokens or 0 for r in both) / prompt if prompt else None


def _request_record(r: RequestResult, t0: float) -> dict[str, Any]:
    return {
        "session": r.session,
        "turn": r.turn,
        "ok": r.ok,
        "error": r.error,
        "start_s": r.start - t0 if r.start else None,
        "ttft_s": r.ttft,
        "latency_s": r.latency,
        "tpot_s": tpot(r),
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        "stream_tokens": r.stream_tokens,
        "cached_tokens": r.cached_tokens,
        "finish_reason": r.finish_reason,
    }


def failed_run(workload: Workload, target: dict[str, Any], message: str) -> dict[str, Any]:
    """The report of a run that never started (e.g. the server did not come up)."""
    results = [
        RequestResult(session=i, turn=t, error=message)
        for i, s in enumerate(workload.sessions)
        for t in range(len(s.turns))
    ]
    run = RunResult(results, wall_time=0.0, started_at="", concurrency=0, t0=0.0)
    report = summarize(run, workload, target)
    report["fatal"] = message
    return report


# -- comparisons ------------------------------------------------------------------------------

# (key path, label, higher is better)
RATIO_METRICS = (
    (("output_tokens_per_s",), "output tok/s", True),
    (("requests_per_s",), "requests/s", True),
    (("wall_time_s",), "wall time", False),
    (("ttft_s", "p50"), "TTFT p50", False),
    (("ttft_s", "p90"), "TTFT p90", False),
    (("itl_s", "p50"), "ITL p50", False),
    (("latency_s", "p50"), "latency p50", False),
    (("cached_share",), "cached share", True),
)


def metric(report: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = report
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def comparisons(runs: list[dict[str, Any]], baseline: str | None = None) -> list[dict[str, Any]]:
    """Per workload: every run's metrics divided by the baseline run's (the first by default)."""
    out = []
    for name, group in by_workload(runs).items():
        if len(group) < 2:
            continue
        base = next((r for r in group if r["label"] == baseline), group[0])
        for r in group:
            if r is base:
                continue
            ratios = {
                ".".join(path): ratio(metric(r, path), metric(base, path))
                for path, _, _ in RATIO_METRICS
            }
            out.append(
                {
                    "workload": name,
                    "baseline": base["label"],
                    "target": r["label"],
                    "ratios": ratios,
                }
            )
    return out


def by_workload(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(r["workload"]["name"], []).append(r)
    return groups
