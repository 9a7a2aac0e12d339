"""Readable tables of run reports: one column per target, one table per workload."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localradix.bench.report import RATIO_METRICS, by_workload, metric

Row = tuple[str, Callable[[dict[str, Any]], str]]


def _num(path: tuple[str, ...], scale: float = 1.0, fmt: str = "{:.2f}") -> Callable:
    def cell(r: dict[str, Any]) -> str:
        v = metric(r, path)
        return "-" if v is None else fmt.format(v * scale)

    return cell


def _triple(key: str, scale: float, fmt: str = "{:.1f}") -> Callable:
    cells = [_num((key, f"p{p}"), scale, fmt) for p in (50, 90, 99)]
    return lambda r: " / ".join(c(r) for c in cells)


def _tokens(r: dict[str, Any]) -> str:
    t = r["tokens"]
    usage = "-" if t["output_from_usage"] is None else str(t["output_from_usage"])
    return f"{usage} / {t['output_from_stream']}"


def _share(r: dict[str, Any]) -> str:
    v = r.get("cached_share")
    return "n/a" if v is None else f"{100 * v:.1f}%"


ROWS: tuple[Row, ...] = (
    ("requests ok / total", lambda r: f"{r['requests']['ok']} / {r['requests']['total']}"),
    ("errors", lambda r: str(r["requests"]["errors"])),
    ("concurrency", lambda r: str(r["concurrency"])),
    ("wall time (s)", _num(("wall_time_s",))),
    ("requests/s", _num(("requests_per_s",))),
    ("output tok/s", _num(("output_tokens_per_s",), fmt="{:.1f}")),
    ("prompt tokens", _num(("tokens", "prompt"), fmt="{:.0f}")),
    ("output tokens usage / stream", _tokens),
    ("cached prompt share", _share),
    ("TTFT p50/p90/p99 (ms)", _triple("ttft_s", 1000)),
    ("ITL p50/p90/p99 (ms)", _triple("itl_s", 1000)),
    ("TPOT p50 (ms)", _num(("tpot_s", "p50"), 1000, "{:.1f}")),
    ("latency p50/p90/p99 (s)", _triple("latency_s", 1, "{:.2f}")),
)


def render(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    line = lambda cells: "  ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def format_runs(runs: list[dict[str, Any]]) -> str:
    blocks = []
    for name, group in by_workload(runs).items():
        params = group[0]["workload"]["params"]
        sizes = ", ".join(f"{k}={v}" for k, v in params.items() if k != "nonce")
        headers = [f"workload {name}", *(r["label"] for r in group)]
        rows = [[label, *(cell(r) for r in group)] for label, cell in ROWS]
        blocks.append(f"{render(headers, rows)}\n  ({sizes})")
        blocks.extend(_error_lines(group))
    return "\n\n".join(blocks)


def _error_lines(group: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in group:
        counts = r.get("error_counts") or {}
        if counts:
            lines = [f"  {n} x {msg}" for msg, n in sorted(counts.items(), key=lambda x: -x[1])]
            out.append(f"errors at {r['label']}:\n" + "\n".join(lines[:10]))
    return out


def format_comparisons(comps: list[dict[str, Any]]) -> str:
    blocks = []
    by_wl: dict[str, list[dict[str, Any]]] = {}
    for c in comps:
        by_wl.setdefault(c["workload"], []).append(c)
    for name, group in by_wl.items():
        base = group[0]["baseline"]
        headers = [f"{name}: ratio to {base}", *(c["target"] for c in group)]
        rows = []
        for path, label, higher in RATIO_METRICS:
            key = ".".join(path)
            better = "higher" if higher else "lower"
            cells = [_ratio_cell(c["ratios"].get(key)) for c in group]
            rows.append([f"{label} ({better} is better)", *cells])
        blocks.append(render(headers, rows))
    return "\n\n".join(blocks)


def _ratio_cell(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"
