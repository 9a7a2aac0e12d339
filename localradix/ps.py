"""`localradix ps`: the models a running server has loaded, asked over HTTP (the stats feed,
`/v1/stats`, has a row per model): where each runs, its memory (weights + KV), its state
(loading, ready, unloading, failed) and how long until it unloads if left idle."""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

from localradix.store.source import ModelSourceError


def add_ps_parser(subparsers: Any) -> None:
    from localradix.tui.env import DEFAULT_URL, KEY_ENV, URL_ENV

    p = subparsers.add_parser(
        "ps",
        help="list the models a running server has loaded",
        description="Ask a running `localradix serve` which models it has loaded.",
    )
    p.add_argument("--url", default=os.environ.get(URL_ENV, DEFAULT_URL),
                   help=f"server base URL (default: ${URL_ENV} or {DEFAULT_URL})")  # fmt: skip
    p.add_argument("--api-key", default=os.environ.get(KEY_ENV),
                   help=f"bearer token, if the server requires one (default: ${KEY_ENV})")  # fmt: skip


def run_ps(ns: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no log line per request
    stats = _fetch(ns.url.rstrip("/"), ns.api_key)
    rows = [("NAME", "BACKEND", "DEVICE", "CONTEXT", "MEMORY", "STATE", "UNTIL")]
    for model in _models(stats):
        rows.append((
            str(model.get("name")), str(model.get("backend") or "-"),
            str(model.get("device") or "-"), str(model.get("context_length") or "-"),
            _size(model.get("memory_bytes")), str(model.get("state", "ready")),
            _until(model.get("expires_at"), model.get("pinned")),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0


def _models(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """The stats feed's per-model rows (a server older than the model pool: its one model)."""
    if isinstance(stats.get("models"), list):
        return stats["models"]
    info = stats.get("model") or {}
    weights, kv = info.get("weight_bytes"), info.get("kv_bytes")
    memory = (weights or 0) + (kv or 0) if weights or kv else None
    return [{**info, "memory_bytes": memory, "pinned": True}] if info else []


def _fetch(url: str, api_key: str | None) -> dict[str, Any]:
    import httpx

    from localradix.tui.api import auth_headers, auth_problem, describe_error, error_message

    headers = auth_headers(api_key)
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
            stats = client.get("/v1/stats")
    except httpx.HTTPError as exc:
        raise ModelSourceError(
            f"no server answers at {url} ({describe_error(exc)}): start one with "
            "`localradix serve`, or pass --url"
        ) from None
    if stats.status_code != 200:
        problem = auth_problem(stats.status_code, api_key)
        raise ModelSourceError(problem or f"{url}: {error_message(stats.content)}")
    data: dict[str, Any] = stats.json()
    return data


def _size(n: Any) -> str:
    if not isinstance(n, (int, float)) or n <= 0:
        return "-"
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"


def _until(expires_at: Any, pinned: Any) -> str:
    """ "4m59s" from now, or "forever" (pinned, the default model, keep_alive -1)."""
    if pinned or not isinstance(expires_at, (int, float)):
        return "forever"
    return _duration(max(0.0, expires_at - time.time()))


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
