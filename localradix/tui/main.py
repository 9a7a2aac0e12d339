"""Starting the dashboard: attach to a URL, or start a server first and stop it on quit.

The server it starts listens on port 8000 unless that is busy (then on a free port, and it
says so); a port given with --port is used or refused, never swapped. The API key reaches
that server through its environment, never its command line (visible in `ps`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localradix.child_server import HOST, ServerProcess, free_port, port_in_use, serve_argv
from localradix.tui.api import ApiClient
from localradix.tui.gateway import GatewayFeed
from localradix.tui.system import SystemProbe, is_local

LOG_FILE = Path(tempfile.gettempdir()) / "localradix-tui.log"
DEFAULT_PORT = 8000
SERVER_LOG_PREFIX = "localradix-server-"

logger = logging.getLogger("localradix.tui")


class PortBusy(RuntimeError):
    """The port the user asked for with --port is taken."""


def make_app(url: str, api_key: str | None, *, theme: str | None = None, server: Any = None):
    from localradix.tui.app import LocalRadixApp

    pid = getattr(server, "pid", None)
    return LocalRadixApp(
        GatewayFeed(url, api_key),
        ApiClient(url, api_key),
        probe=SystemProbe(local=is_local(url), pid=pid),
        server=server,
        theme=theme,
    )


@contextlib.contextmanager
def logging_to_file(path: Path = LOG_FILE) -> Iterator[None]:
    """Send log records to a file while the dashboard owns the terminal (a line written to
    stderr, such as httpx's per-request INFO, would tear the screen)."""
    root = logging.getLogger()
    saved = root.handlers[:]
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.handlers = [handler]
    quiet = [logging.getLogger(n) for n in ("httpx", "httpcore")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.handlers = saved
        handler.close()
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


def attach(url: str, api_key: str | None = None, theme: str | None = None) -> int:
    with logging_to_file():
        make_app(url, api_key, theme=theme).run()
    return 0


class ServerHandle:
    """A `localradix serve` subprocess started for the dashboard (pid, exit code, log file);
    `notice` says why it is not on the default port, if it is not."""

    def __init__(self, process: Any, notice: str | None = None, api_key: str | None = None) -> None:
        self.process = process
        self.url = process.base
        self.notice = notice
        self.api_key = api_key

    @property
    def pid(self) -> int:
        return self.process.proc.pid

    @property
    def log_path(self) -> Any:
        return self.process.log_path

    def poll(self) -> int | None:
        return self.process.proc.poll()

    def stop(self) -> None:
        self.process.stop(keep_log=self.poll() not in (None, 0))


def choose_port(asked: int | None) -> tuple[int, str | None]:
    """The port to serve on, and a notice when the default one was busy. A port the user
    asked for is never swapped for another: PortBusy if it is taken."""
    if asked is not None:
        if port_in_use(HOST, asked):
            raise PortBusy(
                f"port {asked} on {HOST} is already in use (another localradix?); stop what "
                "listens there, or leave out --port to serve on a free port"
            )
        return asked, None
    if not port_in_use(HOST, DEFAULT_PORT):
        return DEFAULT_PORT, None
    port = free_port(HOST)
    return port, f"port {DEFAULT_PORT} is busy (another server?), so serving on port {port}"


def server_api_key(ns: argparse.Namespace) -> str | None:
    """The key the started server requires: --api-key, --api-key-file or $LOCALRADIX_API_KEY."""
    from localradix.config import ServerArgs
    from localradix.server.security import resolve_api_key

    return resolve_api_key(
        ServerArgs(
            api_key=getattr(ns, "api_key", None), api_key_file=getattr(ns, "api_key_file", None)
        )
    )


def start_server(ns: argparse.Namespace) -> ServerHandle:
    """Start `localradix serve` with the ServerArgs in `ns` without waiting for it: the
    dashboard shows it loading, then attaches. PortBusy if the --port asked for is taken."""
    from localradix.server.security import API_KEY_ENV

    port, notice = choose_port(getattr(ns, "port", None))
    if notice:
        logger.warning("%s", notice)
    key = server_api_key(ns)
    env = {**os.environ, **({API_KEY_ENV: key} if key else {})}
    process = ServerProcess(serve_argv(ns, port), port, env=env, log_prefix=SERVER_LOG_PREFIX)
    process.start()
    return ServerHandle(process, notice, key)


def serve_and_attach(ns: argparse.Namespace) -> int:
    from localradix.server.security import ApiKeyError

    try:
        server = start_server(ns)
    except (PortBusy, ApiKeyError) as exc:
        print(f"localradix: error: {exc}", file=sys.stderr, flush=True)
        return 1
    log = server.log_path
    if server.notice:
        print(f"localradix: {server.notice}", flush=True)
    print(f"localradix: starting the server on {server.url} (log: {log})", flush=True)
    try:
        app = make_app(
            server.url,
            server.api_key,
            theme=getattr(ns, "theme", None),
            server=server,
        )
        app.run()
    finally:
        code = server.poll()
        if code is None:
            print("localradix: stopping the server…", flush=True)
        server.stop()
    if code not in (None, 0):
        print(f"localradix: the server exited with code {code}", file=sys.stderr)
        print(server.process.log_tail(), file=sys.stderr)
        print(f"(full log: {log})", file=sys.stderr)
        return 1
    return 0
