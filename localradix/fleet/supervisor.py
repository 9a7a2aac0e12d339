"""`localradix serve --replicas 2`: start N replicas and the smg gateway, keep them running,
stop them all on Ctrl-C / SIGTERM.

Startup is all or nothing: every replica must load its model (in parallel) before the gateway
starts, and a replica that cannot start stops the fleet with its log tail. After that a replica
or gateway that exits is restarted with backoff (child.Child) while the others keep serving.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import FrameType

import httpx

from localradix.child_server import LaunchError, free_port, localradix_env, serve_argv
from localradix.config import ServerArgs
from localradix.fleet.child import DEFAULT_BACKOFF, Backoff, Child
from localradix.fleet.gateway import GatewayMissing, gateway_argv, require_smg
from localradix.fleet.placement import Placement, place_replicas

logger = logging.getLogger("localradix.fleet")
WORKER_HOST = "127.0.0.1"  # replicas listen on loopback only; the gateway is the front door
TICK_S = 0.5
READY_TIMEOUT_S = 600.0


class Stopped(Exception):
    """A signal arrived while the fleet was starting."""


class Fleet:
    def __init__(self, args: ServerArgs, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self.args = args
        self.replicas = [
            _replica(i, args, placement, backoff)
            for i, placement in enumerate(place_replicas(args.replicas, args))
        ]
        urls = [r.url for r in self.replicas]
        argv = gateway_argv(args, urls, free_port(WORKER_HOST))
        front = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        env = {**localradix_env(), **_key_env(args)}
        self.gateway = Child("gateway", argv, args.port, env, backoff, front)
        self.stopping = threading.Event()

    @property
    def children(self) -> list[Child]:
        return [*self.replicas, self.gateway]

    def start(self) -> None:
        """Replicas first (loading in parallel), then the gateway once they all answer.
        LaunchError if one exits or times out, Stopped if a signal came first."""
        for replica in self.replicas:
            replica.start()
        self._await_ready(self.replicas)
        self.gateway.start()
        self._await_ready([self.gateway])

    def _await_ready(self, children: list[Child]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        waiting = list(children)
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while waiting:
                if self.stopping.is_set():
                    raise Stopped
                waiting = [c for c in waiting if not c.answers(client)]
                if time.monotonic() > deadline:
                    names = ", ".join(c.name for c in waiting)
                    raise LaunchError(f"not ready after {READY_TIMEOUT_S:.0f} s: {names}")
                if waiting:
                    self.stopping.wait(0.25)

    def supervise(self) -> None:
        """Restart what exits, until a signal sets `stopping`."""
        while not self.stopping.wait(TICK_S):
            now = time.monotonic()
            for child in self.children:
                child.tend(now)

    def stop(self) -> None:
        """The gateway first (no new requests; in-flight ones finish), then every replica at
        once (each drains for up to --drain-timeout)."""
        self.stopping.set()
        self.gateway.stop()
        with ThreadPoolExecutor(len(self.replicas)) as pool:
            list(pool.map(Child.stop, self.replicas))


def _replica(index: int, args: ServerArgs, placement: Placement, backoff: Backoff) -> Child:
    port = free_port(WORKER_HOST)
    worker = dataclasses.replace(args, replicas=1, router_policy="cache_aware")
    argv = serve_argv(argparse.Namespace(**dataclasses.asdict(worker)), port)
    env = {**localradix_env(), **placement.env, **_key_env(args)}
    logger.info("replica %d: %s", index, placement.label)
    # A key file may list several keys: each replica reads it (a path in argv reveals nothing).
    keys = ["--api-key-file", args.api_key_file] if args.api_key_file and not args.api_key else []
    return Child(f"replica {index}", [*argv, *placement.flags, *keys], port, env, backoff)


def _key_env(args: ServerArgs) -> dict[str, str]:
    """The API key for the replicas and smg, through the environment: `ps` shows argv."""
    from localradix.server.security import API_KEY_ENV, resolve_api_key

    key = resolve_api_key(args)
    return {API_KEY_ENV: key} if key else {}


def run_fleet(args: ServerArgs) -> int:
    problem = _check(args)
    if problem:
        print(f"localradix: error: {problem}", file=sys.stderr, flush=True)
        return 1
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the readiness polls
    fleet = Fleet(args)
    restore = _on_signals(fleet.stopping.set)
    try:
        fleet.start()
        _announce(fleet)
        fleet.supervise()
        return 0
    except Stopped:
        return 0
    except LaunchError as exc:
        print(f"localradix: error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        logger.info("stopping the gateway and %d replicas", len(fleet.replicas))
        fleet.stop()
        restore()


def _check(args: ServerArgs) -> str | None:
    from localradix.server.launch import check_serve_args

    if args.replicas < 1:
        return "--replicas must be at least 1"
    try:
        require_smg()
    except GatewayMissing as exc:
        return str(exc)
    return check_serve_args(args)


def _announce(fleet: Fleet) -> None:
    for r in fleet.replicas:
        logger.info("%s on %s, pid %s (log: %s)", r.name, r.url, r.pid, r.process.log_path)
    logger.info(
        "serving %d replicas behind smg (--router-policy %s) on http://%s:%d (gateway log: %s)",
        len(fleet.replicas),
        fleet.args.router_policy,
        fleet.args.host,
        fleet.args.port,
        fleet.gateway.process.log_path,
    )


def _on_signals(stop: Callable[[], None]) -> Callable[[], None]:
    """SIGINT/SIGTERM set the stop flag (the children then stop in order); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: FrameType | None) -> None:
        stop()

    saved = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, h in saved.items():
            signal.signal(s, h)

    return restore
