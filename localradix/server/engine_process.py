"""The engine process: an EngineCore driven by a loop that talks to the API process over ZMQ.

Wire protocol (pickled; the API process binds both sockets, this process connects):
- requests (PULL): a list of GenerateRequest / AbortRequest / FlushCache / Shutdown.
- outputs (PUSH): `(kind, payload)` tuples:
  ("ready", ModelInfo as dict) or ("load_error", message), once, after loading;
  ("outputs", list[RequestOutput]) after each step that produced any;
  ("stats", EngineStats) at most every STATS_INTERVAL_S (slower when idle);
  ("flush", bool) in answer to FlushCache; ("fatal", traceback) just before dying of a bug.

The loop blocks (poll with a timeout) only when the engine is idle; when it has work it drains
whatever arrived without waiting and runs one step. It never waits on the API process.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from localradix.config import ServerArgs
from localradix.messages import AbortRequest, FlushCache, GenerateRequest

logger = logging.getLogger("localradix.engine_process")

DEFAULT_CORE = "localradix.engine.core:EngineCore"
IDLE_POLL_MS = 100
STATS_INTERVAL_S = 0.2
IDLE_STATS_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Shutdown:
    """Stop the loop and exit 0 (the API process aborts its requests first)."""


def load_factory(path: str) -> Any:
    """`"package.module:attr"` -> the attribute (the EngineCore class, or a test double)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


class EngineLoop:
    def __init__(self, core: Any, pull: zmq.Socket, push: zmq.Socket, parent_pid: int) -> None:
        self.core = core
        self.pull = pull
        self.push = push
        self.parent_pid = parent_pid
        self.stopping = False
        self._stats_due = 0.0
        self._was_busy = False

    def run(self) -> None:
        while not self.stopping:
            busy = self.core.has_work()
            self._receive(0 if busy else IDLE_POLL_MS)
            if self.core.has_work():
                outputs = self.core.step()
                if outputs:
                    self.send("outputs", outputs)
            self._maybe_send_stats(busy)
            if not busy and os.getppid() != self.parent_pid:
                logger.warning("the API process is gone; the engine exits")
                return

    def send(self, kind: str, payload: Any) -> None:
        self.push.send(pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL))

    def _receive(self, timeout_ms: int) -> None:
        if not self.pull.poll(timeout_ms):
            return
        while True:
            try:
                batch = pickle.loads(self.pull.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            for msg in batch:
                self._handle(msg)

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, GenerateRequest):
            self.core.add_request(msg)
        elif isinstance(msg, AbortRequest):
            self.core.abort(msg.rid)
        elif isinstance(msg, FlushCache):
            self.send("flush", bool(self.core.flush_cache()))
        elif isinstance(msg, Shutdown):
            self.stopping = True
        else:
            logger.error("unknown message %r ignored", msg)

    def _maybe_send_stats(self, busy: bool) -> None:
        now = time.monotonic()
        went_idle = self._was_busy and not busy
        if busy and not self._was_busy:
            self._stats_due = min(self._stats_due, now + STATS_INTERVAL_S)
        self._was_busy = busy
        # One more snapshot right after the engine goes idle, so the feed never shows stale work.
        if now < self._stats_due and not went_idle:
            return
        self._stats_due = now + (STATS_INTERVAL_S if busy else IDLE_STATS_INTERVAL_S)
        self.send("stats", self.core.stats())


def engine_main(
    args: ServerArgs, req_addr: str, out_addr: str, core_factory: str, parent_pid: int
) -> None:
    """Entry point of the engine process (multiprocessing target; exit code 1 on failure)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the API process, which drains
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s [engine] %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(req_addr)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(out_addr)
    loop = EngineLoop(None, pull, push, parent_pid)
    signal.signal(signal.SIGTERM, lambda *_: setattr(loop, "stopping", True))
    loaded, crash = _run_in_thread(loop, lambda: load_factory(core_factory)(args))
    if not loaded:  # the load failure was reported, not a silent death
        _close(ctx, pull, push)
        sys.exit(1)
    if crash is not None:
        logger.critical("the engine loop crashed:\n%s", crash)
        loop.send("fatal", crash.strip().splitlines()[-1])
        _close(ctx, pull, push)
        sys.exit(1)
    _close(ctx, pull, push)


def _load(loop: EngineLoop, build: Callable[[], Any]) -> bool:
    try:
        loop.core = build()
    except BaseException as exc:
        # One line; the traceback only under --log-level debug (the API process reports it too).
        logger.error(
            "the engine failed to load: %s", exc, exc_info=logger.isEnabledFor(logging.DEBUG)
        )
        loop.send("load_error", f"{type(exc).__name__}: {exc}")
        return False
    loop.send("ready", dataclasses.asdict(loop.core.info))
    return True


def _run_in_thread(loop: EngineLoop, build: Callable[[], Any]) -> tuple[bool, str | None]:
    """Load the core and run the loop on one worker thread, as the in-process Engine does:
    (loaded, the traceback if the loop died).

    Stepping torch from the main thread measured ~4x the CPU time per token on a small busy
    CPU (intra-op threads spinning at barriers); a worker thread matches `localradix.Engine`.
    The core is built on that same thread: llama.cpp's OpenMP team belongs to the thread that
    first runs it, and a second thread's team throttles both (measured: 35 instead of ~110
    tok/s). The main thread only waits, so SIGTERM is still handled promptly.
    """
    crash: list[str] = []
    loaded: list[bool] = []

    def target() -> None:
        loaded.append(_load(loop, build))
        if not loaded[0]:
            return
        try:
            loop.run()
        except BaseException:
            crash.append(traceback.format_exc())

    worker = threading.Thread(target=target, name="localradix-engine-loop", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
    return bool(loaded and loaded[0]), crash[0] if crash else None


def _close(ctx: zmq.Context, *sockets: zmq.Socket) -> None:
    for sock in sockets:
        sock.close()
    ctx.term()
