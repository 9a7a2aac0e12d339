"""`localradix tui` (attach to a running server) and bare `localradix` (serve + attach).

Only argparse is imported here; Textual and httpx load when the TUI starts, and the TUI never
imports torch: it talks to the server over HTTP only.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["add_tui_parser", "add_up_parser", "run_default", "run_tui"]

from localradix.tui.env import DEFAULT_URL, KEY_ENV, URL_ENV

THEME_CHOICES = ("textual-dark", "textual-light")


def _add_display_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--theme",
        choices=THEME_CHOICES,
        default=None,
        help="colour theme (default: dark; `t` toggles while running)",
    )


def add_tui_parser(subparsers: Any) -> None:
    """Add the `tui` subcommand: attach the dashboard to a running server."""
    p = subparsers.add_parser(
        "tui",
        help="live dashboard (batches, KV memory, radix cache) of a running server",
        description="Attach a live dashboard to a running localradix server.",
    )
    p.add_argument(
        "--url",
        default=os.environ.get(URL_ENV, DEFAULT_URL),
        help=f"server base URL (default: ${URL_ENV} or {DEFAULT_URL})",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get(KEY_ENV),
        help=f"bearer token, if the server requires one (default: ${KEY_ENV})",
    )
    p.add_argument("--api-key-file", default=None, help="read the bearer token from this file")
    _add_display_args(p)
    p.set_defaults(func=run_tui)


def add_up_parser(subparsers: Any, name: str = "up") -> None:
    """Add the subcommand a bare `localradix` runs: start a server and open the dashboard."""
    from localradix.config import add_server_args

    p = subparsers.add_parser(
        name,
        help="start a server on the bundled model (or --model) and open the dashboard",
        description="Start `localradix serve` in the background and open the live dashboard; "
        "quitting the dashboard stops the server.",
    )
    add_server_args(p)
    _add_display_args(p)
    # None: not given, so a busy 8000 falls back to a free port; a given one is never swapped.
    p.set_defaults(func=run_default, port=None)


def run_tui(ns: argparse.Namespace) -> int:
    """Attach to the server at `ns.url`; returns when the user quits."""
    from localradix.tui.main import attach

    api_key = getattr(ns, "api_key", None)
    key_file = getattr(ns, "api_key_file", None)
    if key_file and not api_key:
        try:
            with open(key_file, encoding="utf-8") as f:
                api_key = f.read().strip() or None
        except OSError as exc:
            print(f"localradix: error: cannot read --api-key-file: {exc}", flush=True)
            return 1
    return attach(
        url=getattr(ns, "url", None) or DEFAULT_URL,
        api_key=api_key,
        theme=getattr(ns, "theme", None),
    )


def run_default(ns: argparse.Namespace) -> int:
    """Serve with the ServerArgs in `ns` on a free local port, attach, stop the server on quit."""
    from localradix.tui.main import serve_and_attach

    return serve_and_attach(ns)
