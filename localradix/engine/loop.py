"""The engine loop: one core, driven one step at a time, fed and heard through a transport.

The same loop runs in the server's engine process (ZMQ sockets to the API process) and on the
in-process `Engine`'s thread (queues). It blocks only when the core is idle; when it has work it
drains whatever arrived without waiting and runs one step. It never waits on its peer.
"""

from __future__ import annotations

import logging
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from localradix.messages import (
    AbortRequest,
    EngineEvent,
    EngineStats,
    Fatal,
    FlushCache,
    FlushDone,
    GenerateRequest,
    LoadFailed,
    ModelInfo,
    Ready,
    RequestOutput,
    Shutdown,
    StepOutputs,
)

logger = logging.getLogger("localradix.engine")

STATS_INTERVAL_S = 0.2
IDLE_STATS_INTERVAL_S = 1.0


class Core(Protocol):
    """What the loop drives: EngineCore, or a test double."""

    info: ModelInfo

    def add_request(self, req: GenerateRequest) -> None: ...
    def abort(self, rid: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_work(self) -> bool: ...
    def stats(self) -> EngineStats: ...
    def flush_cache(self) -> bool: ...


class Transport(Protocol):
    """The loop's side of the channel to its front end."""

    feeds_stats: bool  # send EngineStats snapshots while running (the server's /stats feed)

    def receive(self, block: bool) -> list[Any]:
        """Messages that arrived; with `block`, wait for one first (a transport may give up
        after a while and return [], so the loop can check on its peer)."""
        ...

    def send(self, event: EngineEvent) -> None: ...

    def peer_alive(self) -> bool: ...


@dataclass(frozen=True)
class CoreCall:
    """Run `fn(core)` on the loop's thread; `(True, result)` or `(False, exc)` goes to `reply`.
    In-process only (a function does not cross a process boundary)."""

    fn: Callable[[Any], Any]
    reply: queue.Queue[tuple[bool, Any]]


class EngineLoop:
    def __init__(self, core: Core, transport: Transport) -> None:
        self.core = core
        self.transport = transport
        self.stopping = False
        self._stats_due = 0.0
        self._was_busy = False

    def run(self) -> None:
        while not self.stopping:
            busy = self.core.has_work()
            for msg in self.transport.receive(block=not busy):
                self._handle(msg)
            if self.stopping:
                return
            if self.core.has_work():
                outputs = self.core.step()
                if outputs:
                    self.transport.send(StepOutputs(outputs))
            if self.transport.feeds_stats:
                self._maybe_send_stats(busy)
            if not busy and not self.transport.peer_alive():
                logger.warning("the front end is gone; the engine loop ends")
                return

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, GenerateRequest):
            self.core.add_request(msg)
        elif isinstance(msg, AbortRequest):
            self.core.abort(msg.rid)
        elif isinstance(msg, FlushCache):
            self.transport.send(FlushDone(bool(self.core.flush_cache())))
        elif isinstance(msg, Shutdown):
            self.stopping = True
        elif isinstance(msg, CoreCall):
            try:
                msg.reply.put((True, msg.fn(self.core)))
            except Exception as exc:  # reported to the caller's thread
                msg.reply.put((False, exc))
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
        self.transport.send(self.core.stats())


def run_engine(build: Callable[[], Core], transport: Transport) -> bool:
    """Build the core on this thread, announce it, and loop until Shutdown (or the peer is
    gone). False when it failed to load or crashed; the peer was told either way.

    Building and stepping on one thread matters: llama.cpp's OpenMP team belongs to the thread
    that first runs it, and a second thread's team throttles both.
    """
    try:
        core = build()
    except BaseException as exc:
        # One line; the traceback only under --log-level debug (the front end reports it too).
        debug = logger.isEnabledFor(logging.DEBUG)
        logger.error("the engine failed to load: %s", exc, exc_info=debug)
        transport.send(LoadFailed(f"{type(exc).__name__}: {exc}"))
        return False
    transport.send(Ready(core.info))
    try:
        EngineLoop(core, transport).run()
        persist = getattr(core, "persist", None)  # after a crash the cache may be half-done
        if persist is not None:
            persist()
    except Exception:  # a bug or a device error: tell the peer, never leave it waiting
        crash = traceback.format_exc()
        logger.critical("the engine loop crashed:\n%s", crash)
        transport.send(Fatal(crash.strip().splitlines()[-1]))
        return False
    finally:
        close = getattr(core, "close", None)  # test doubles have none
        if close is not None:
            close()
    return True
