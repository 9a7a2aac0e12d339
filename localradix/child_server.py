"""A `localradix serve` child process, as the benchmarks, the dashboard (`up`) and the replica
supervisor (`--replicas`) start one: its command line (built here only), environment and port;
started, waited for until it answers, and stopped.

The server runs in its own session (process group) so that stopping it also stops the worker
processes it spawned: SIGINT first (a clean shutdown), then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

LOG_TAIL_LINES = 30


class LaunchError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


HOST = "127.0.0.1"
# Flags the starter sets itself (an API key travels in the environment, never in argv: `ps`).
SERVER_FLAGS_OWNED = ("model", "host", "port", "api_key", "api_key_file")


def serve_argv(ns: argparse.Namespace, port: int) -> list[str]:
    """`python -m localradix serve [MODEL] --host 127.0.0.1 --port P` plus every ServerArgs flag
    in `ns` that differs from its default."""
    from localradix.config import ServerArgs

    flags: list[str] = []
    for f in dataclasses.fields(ServerArgs):
        if f.name in SERVER_FLAGS_OWNED or not hasattr(ns, f.name):
            continue
        value = getattr(ns, f.name)
        if value == f.default or value is None or value == ():
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag)
        elif isinstance(value, (list, tuple)):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return _serve(getattr(ns, "model", None), port, flags)


def localradix_argv(server_args: tuple[str, ...], port: int, model: str | None) -> list[str]:
    """A benchmark's server: `serve [MODEL] --host 127.0.0.1 --port P ARGS`, with the disk tier
    off unless ARGS set it: KV an earlier run left on disk would make cold requests hits."""
    given = any(a.split("=")[0] == "--kv-disk-cache" for a in server_args)
    disk = [] if given else ["--kv-disk-cache", "off"]
    return _serve(model, port, [*disk, *server_args])


def _serve(model: str | None, port: int, flags: list[str]) -> list[str]:
    head = [sys.executable, "-m", "localradix", "serve", *([str(model)] if model else [])]
    return [*head, "--host", HOST, "--port", str(port), *flags]


def port_in_use(host: str, port: int) -> bool:
    """Whether binding `host:port` fails because something listens there (as uvicorn binds:
    SO_REUSEADDR, so a socket in TIME_WAIT does not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def localradix_env() -> dict[str, str]:
    """The environment for a launched localradix: from a source checkout that is not installed,
    the child must still find the package whatever the working directory."""
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").exists():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


def port_in_args(args: tuple[str, ...] | list[str]) -> int | None:
    """The --port a user passed among server args, if any (it then wins over ours)."""
    for i, a in enumerate(args):
        if a == "--port" and i + 1 < len(args):
            return int(args[i + 1])
        if a.startswith("--port="):
            return int(a.split("=", 1)[1])
    return None


def command_argv(command: str, port: int) -> list[str]:
    return shlex.split(command.replace("{port}", str(port)))


class ServerProcess:
    """A server subprocess; use as a context manager: enter = started and ready."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        ready_timeout: float = 300.0,
        env: dict[str, str] | None = None,
        log_prefix: str = "localradix-bench-server-",
    ) -> None:
        self.argv, self.port, self.ready_timeout, self.env = argv, port, ready_timeout, env
        self.log_prefix = log_prefix
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def __enter__(self) -> ServerProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop(keep_log=True)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(keep_log=exc_type is not None)

    def start(self) -> None:
        fd, path = tempfile.mkstemp(prefix=self.log_prefix, suffix=".log")
        self.log_path = Path(path)
        with os.fdopen(fd, "wb") as log:
            try:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=os.name == "posix",
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                    env=self.env,
                )
            except OSError as e:
                raise LaunchError(f"cannot start {shlex.join(self.argv)}: {e}") from e

    def wait_ready(self) -> None:
        """Poll GET /health (or GET /v1/models) until 200; raise LaunchError with the log tail."""
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                code = self.proc.poll()
                if code is not None:
                    raise LaunchError(self._failure(f"server exited with code {code}"))
                if self._answers(client):
                    return
                time.sleep(0.25)
        raise LaunchError(self._failure(f"server not ready after {self.ready_timeout:.0f} s"))

    def _answers(self, client: httpx.Client) -> bool:
        for path in ("/health", "/v1/models"):
            try:
                if client.get(self.base + path).status_code == 200:
                    return True
            except httpx.HTTPError:
                return False  # not listening yet
        return False

    def _failure(self, what: str) -> str:
        return (
            f"{what}: {shlex.join(self.argv)}\n"
            f"--- server output, last lines (full log: {self.log_path}) ---\n{self.log_tail()}"
        )

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no output)"
        lines = self.log_path.read_text("utf-8", "replace").splitlines()
        return "\n".join(lines[-n:]) or "(no output)"

    def stop(self, keep_log: bool = False) -> None:
        """Stop the server (if running); remove its log unless `keep_log`."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self._terminate(proc)
        if not keep_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def _terminate(self, proc: subprocess.Popen) -> None:
        for sig, wait in ((signal.SIGINT, 15.0), (signal.SIGTERM, 5.0)):
            self._signal(sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            self._signal(signal.SIGKILL if os.name == "posix" else signal.SIGTERM)
            proc.wait(timeout=10)
        if os.name == "posix":
            self._signal(signal.SIGTERM)  # workers that outlived the main process

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        try:
            if os.name == "posix":
                os.killpg(self.proc.pid, sig)  # the server and any workers it started
            elif sig == signal.SIGINT:
                self.proc.terminate()
            else:
                self.proc.kill()
        except (ProcessLookupError, PermissionError):
            pass


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM if we die without stopping it (no orphaned servers)."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
