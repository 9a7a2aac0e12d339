"""Starting the dashboard: attach to a URL, or start a server first and stop it on quit."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localradix.tui.api import ApiClient
from localradix.tui.feed import HttpFeed
from localradix.tui.system import SystemProbe, is_local

SERVER_FLAGS_OWNED = ("model", "host", "port")  # set by serve_and_attach itself
LOG_FILE = Path(tempfile.gettempdir()) / "localradix-tui.log"


def make_app(url: str, api_key: str | None, *, theme: str | None = None, server: Any = None):
    from localradix.tui.app import LocalRadixApp

    pid = getattr(server, "pid", None)
    return LocalRadixApp(
        HttpFeed(url, api_key),
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


def serve_argv(ns: argparse.Namespace, port: int) -> list[str]:
    """`python -m localradix serve [MODEL] --host 127.0.0.1 --port P` plus every ServerArgs flag
    in `ns` that differs from its default."""
    from localradix.config import ServerArgs

    argv = [sys.executable, "-m", "localradix", "serve"]
    if getattr(ns, "model", None):
        argv.append(str(ns.model))
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    for f in dataclasses.fields(ServerArgs):
        if f.name in SERVER_FLAGS_OWNED or not hasattr(ns, f.name):
            continue
        value = getattr(ns, f.name)
        if value == f.default or value is None or value == ():
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


class ServerHandle:
    """A `localradix serve` subprocess started for the dashboard (pid, exit code, log file)."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self.url = process.base

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


def start_server(ns: argparse.Namespace) -> ServerHandle:
    """Start `localradix serve` with the ServerArgs in `ns` (on a free port unless --port was
    given) without waiting for it: the dashboard shows it loading, then attaches."""
    from localradix.bench.launch import ServerProcess, free_port
    from localradix.config import ServerArgs

    default_port = ServerArgs().port
    port = getattr(ns, "port", default_port)
    port = free_port() if port == default_port else port
    process = ServerProcess(serve_argv(ns, port), port)
    process.start()
    return ServerHandle(process)


def serve_and_attach(ns: argparse.Namespace) -> int:
    server = start_server(ns)
    log = server.log_path
    print(f"localradix: starting the server on {server.url} (log: {log})", flush=True)
    try:
        app = make_app(
            server.url,
            getattr(ns, "api_key", None),
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
