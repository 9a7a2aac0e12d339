"""`localradix ps`: the models a running server has loaded, asked over HTTP (`/v1/models` for
the names, `/v1/stats` for where each runs). A server serves one model today; the table has a
row per model the server lists, so it stays right when a server holds several."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from localradix.loader.source import ModelSourceError


def add_ps_parser(subparsers: Any) -> None:
    from localradix.tui import DEFAULT_URL, KEY_ENV, URL_ENV

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
    models, stats = _fetch(ns.url.rstrip("/"), ns.api_key)
    info = stats.get("model") or {}
    rows = [("NAME", "BACKEND", "DEVICE", "CONTEXT", "KV TOKENS", "UP")]
    for card in models:
        mine = info if info.get("name") == card.get("id") else {}
        rows.append((
            str(card.get("id")), str(mine.get("backend", "-")), str(mine.get("device", "-")),
            str(card.get("max_model_len", "-")), str(mine.get("kv_total_tokens", "-")),
            _duration(stats.get("uptime_s")),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0


def _fetch(url: str, api_key: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import httpx

    from localradix.tui.api import auth_headers, auth_problem, describe_error, error_message

    headers = auth_headers(api_key)
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
            models = client.get("/v1/models")
            stats = client.get("/v1/stats")
    except httpx.HTTPError as exc:
        raise ModelSourceError(
            f"no server answers at {url} ({describe_error(exc)}): start one with "
            "`localradix serve`, or pass --url"
        ) from None
    for response in (models, stats):
        if response.status_code != 200:
            problem = auth_problem(response.status_code, api_key)
            raise ModelSourceError(problem or f"{url}: {error_message(response.content)}")
    return models.json().get("data", []), stats.json()


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
