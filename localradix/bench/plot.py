"""PNG charts of a benchmark: throughput and TTFT side by side, one row per workload.

matplotlib is imported here only (with the Agg backend), so the rest of the bench never needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localradix.bench.report import by_workload, metric


def plot_runs(runs: list[dict[str, Any]], path: str | Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from e
    groups = by_workload(runs)
    fig, axes = plt.subplots(
        len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False, constrained_layout=True
    )
    for row, (name, group) in zip(axes, groups.items(), strict=True):
        _throughput(row[0], name, group)
        _ttft(row[1], name, group)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _labels(group: list[dict[str, Any]]) -> list[str]:
    return [_label(r) for r in group]


def _label(r: dict[str, Any]) -> str:
    text = r["label"] if len(r["label"]) <= 28 else r["label"][:26] + "…"
    errors = r["requests"]["errors"]
    return f"{text}\n({errors} errors)" if errors else text


def _throughput(ax, name: str, group: list[dict[str, Any]]) -> None:
    values = [metric(r, ("output_tokens_per_s",)) or 0.0 for r in group]
    bars = ax.bar(range(len(group)), values, color="tab:blue")
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(group)), _labels(group), rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"{name}: throughput (higher is better)")


def _ttft(ax, name: str, group: list[dict[str, Any]]) -> None:
    width = 0.26
    for k, (p, color) in enumerate(((50, "tab:green"), (90, "tab:orange"), (99, "tab:red"))):
        xs = [i + (k - 1) * width for i in range(len(group))]
        ms = [1000 * (metric(r, ("ttft_s", f"p{p}")) or 0.0) for r in group]
        ax.bar(xs, ms, width, label=f"p{p}", color=color)
    ax.set_xticks(range(len(group)), _labels(group), rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("time to first token (ms)")
    ax.set_title(f"{name}: TTFT (lower is better)")
    ax.legend(fontsize=8)
