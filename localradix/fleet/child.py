"""One supervised subprocess (a replica or the gateway): started, watched, restarted after an
exponential backoff when it exits, stopped with the rest of the fleet.

The process runs in its own session (child_server.ServerProcess), so a terminal's Ctrl-C
reaches the supervisor only, which then stops every child in order; on Linux a child also gets
SIGTERM if the supervisor dies without stopping it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from localradix.child_server import LaunchError, ServerProcess

logger = logging.getLogger("localradix.fleet")


@dataclass(frozen=True)
class Backoff:
    """Restart delays: first_s, doubling per consecutive failure, at most max_s; a child that
    stayed up for healthy_s starts again from first_s."""

    first_s: float = 1.0
    max_s: float = 30.0
    healthy_s: float = 60.0

    def delay(self, failures: int) -> float:
        return min(self.max_s, self.first_s * 2 ** max(0, failures - 1))


DEFAULT_BACKOFF = Backoff()


class Child:
    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        env: Mapping[str, str],
        backoff: Backoff = DEFAULT_BACKOFF,
        connect_host: str = "127.0.0.1",
    ) -> None:
        self.name, self.backoff = name, backoff
        prefix = f"localradix-{name.replace(' ', '-')}-"
        self.process = ServerProcess(argv, port, env=dict(env), log_prefix=prefix)
        self.process.base = f"http://{connect_host}:{port}"
        self.url = self.process.base
        self.failures = 0  # consecutive exits without a healthy stretch
        self.restarts = 0
        self.started_at = 0.0
        self.restart_at: float | None = None  # set while waiting out a backoff

    @property
    def pid(self) -> int | None:
        proc = self.process.proc
        return proc.pid if proc is not None else None

    def start(self) -> None:
        self.process.start()
        self.started_at, self.restart_at = time.monotonic(), None

    def answers(self, client: httpx.Client) -> bool:
        """Whether GET /health answers 200 now; LaunchError (with its log tail) if the process
        has exited."""
        code = self.exit_code()
        if code is not None:
            log, tail = self.process.log_path, self.process.log_tail()
            raise LaunchError(f"{self.name} exited with code {code} (log: {log}):\n{tail}")
        try:
            return client.get(self.url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def exit_code(self) -> int | None:
        proc = self.process.proc
        return None if proc is None else proc.poll()

    def tend(self, now: float) -> None:
        """Notice an exit and schedule the restart; restart once the backoff has passed."""
        if self.restart_at is not None:
            if now >= self.restart_at:
                self.restarts += 1
                self.start()
                logger.info(
                    "%s on %s, pid %s (restart %d)", self.name, self.url, self.pid, self.restarts
                )
            return
        code = self.exit_code()
        if code is None:
            return
        if now - self.started_at >= self.backoff.healthy_s:
            self.failures = 0
        self.failures += 1
        delay = self.backoff.delay(self.failures)
        self.restart_at = now + delay
        logger.warning(
            "%s (pid %s) exited with code %s; restarting in %.0f s. Its last lines (log: %s):\n%s",
            self.name,
            self.pid,
            code,
            delay,
            self.process.log_path,
            self.process.log_tail(10),
        )

    def stop(self) -> None:
        self.restart_at = None
        self.process.stop(keep_log=True)
