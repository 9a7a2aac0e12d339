"""The API process's handle on the engine process: spawn, readiness, messages, death.

Outputs are routed to per-request listeners by rid. A watchdog notices when the engine process
dies (crash, OOM kill, `kill -9`): every listener is woken with `None`, `dead_message` explains
what happened, and the `on_death` callbacks run (the CLI then shuts the server down, non-zero).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from localradix.config import ServerArgs
from localradix.messages import (
    EngineEvent,
    EngineStats,
    Fatal,
    FlushCache,
    FlushDone,
    LoadFailed,
    ModelInfo,
    Ready,
    RequestOutput,
    Shutdown,
    StepOutputs,
)
from localradix.server.engine_process import DEFAULT_CORE, engine_main

logger = logging.getLogger("localradix.server")

Listener = Callable[[RequestOutput | None], None]  # None: the engine died
WATCHDOG_INTERVAL_S = 0.2


class EngineError(RuntimeError):
    """The engine failed to load or is gone."""


class EngineClient:
    def __init__(self, args: ServerArgs, core_factory: str = DEFAULT_CORE) -> None:
        self.args = args
        self.core_factory = core_factory
        self.model_info: ModelInfo | None = None  # set once the engine has loaded
        self.stats: EngineStats | None = None
        self.stats_time = 0.0
        self.dead_message: str | None = None
        self.listeners: dict[str, Listener] = {}
        self.on_death: list[Callable[[str], None]] = []
        self.process: multiprocessing.process.BaseProcess | None = None
        self._dir = tempfile.mkdtemp(prefix="localradix-")
        self._ctx = zmq.asyncio.Context()
        self._push: zmq.Socket | None = None
        self._pull: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._flush_lock = asyncio.Lock()
        self._flush_reply: asyncio.Future[bool] | None = None
        self._fatal: str | None = None
        self._closing = False

    @property
    def info(self) -> dict[str, Any]:
        """`model_info` as a dict ({} until loaded): the /stats feed's "model" object."""
        return dataclasses.asdict(self.model_info) if self.model_info else {}

    @property
    def loaded(self) -> ModelInfo:
        """The loaded model's facts (callers check readiness first: the engine has loaded)."""
        if self.model_info is None:
            raise RuntimeError("the engine has not loaded a model yet")
        return self.model_info

    @property
    def alive(self) -> bool:
        return self.dead_message is None and self.model_info is not None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> dict[str, Any]:
        """Spawn the engine process and wait until it has loaded the model (or failed to)."""
        req_addr, out_addr = f"ipc://{self._dir}/requests", f"ipc://{self._dir}/outputs"
        self._push = zmq.Context.instance().socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.bind(req_addr)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.bind(out_addr)
        spawn = multiprocessing.get_context("spawn")
        self.process = spawn.Process(
            target=engine_main,
            args=(self.args, req_addr, out_addr, self.core_factory, os.getpid()),
            name="localradix-engine",
            daemon=True,
        )
        self.process.start()
        self.model_info = await self._wait_ready()
        self._tasks = [
            asyncio.create_task(self._dispatch(), name="engine-outputs"),
            asyncio.create_task(self._watchdog(), name="engine-watchdog"),
        ]
        return self.info

    async def _wait_ready(self) -> ModelInfo:
        assert self._pull is not None and self.process is not None
        while True:
            if await self._pull.poll(200):
                event = pickle.loads(await self._pull.recv())
                if isinstance(event, Ready):
                    return event.info
                if isinstance(event, LoadFailed):
                    raise EngineError(f"the engine failed to load the model: {event.message}")
                self._handle(event)
            elif not self.process.is_alive():
                raise EngineError(
                    f"the engine process exited during loading (exit code {self.process.exitcode})"
                )

    async def close(self, timeout: float = 30.0) -> None:
        """Abort what is left, stop the engine process (which writes its prefix cache to the
        disk tier first) and release the sockets."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        if self.process is not None and self.process.is_alive():
            self.send([Shutdown()])
            await asyncio.to_thread(self.process.join, timeout)
        self.close_sync()

    def close_sync(self) -> None:
        self._closing = True
        proc = self.process
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for sock in (self._push, self._pull):
            if sock is not None and not sock.closed:
                sock.close(linger=0)
        shutil.rmtree(self._dir, ignore_errors=True)

    # ---- messages ------------------------------------------------------------------------

    def send(self, messages: list[Any]) -> None:
        if self._push is None or self._push.closed:
            raise EngineError("the engine is not running")
        self._push.send(pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL), zmq.NOBLOCK)

    async def flush_cache(self) -> bool:
        async with self._flush_lock:
            self._flush_reply = asyncio.get_running_loop().create_future()
            self.send([FlushCache()])
            try:
                return await asyncio.wait_for(self._flush_reply, 60)
            finally:
                self._flush_reply = None

    async def _dispatch(self) -> None:
        assert self._pull is not None
        while True:
            self._handle(pickle.loads(await self._pull.recv()))

    def _handle(self, event: EngineEvent) -> None:
        if isinstance(event, StepOutputs):
            for out in event.outputs:
                listener = self.listeners.get(out.rid)
                if listener is not None:
                    listener(out)
        elif isinstance(event, EngineStats):
            self.stats = event
            self.stats_time = asyncio.get_running_loop().time()
        elif isinstance(event, FlushDone):
            if self._flush_reply is not None and not self._flush_reply.done():
                self._flush_reply.set_result(event.flushed)
        elif isinstance(event, Fatal):
            self._fatal = event.message
        else:
            logger.warning("unexpected message from the engine: %r", event)

    async def _watchdog(self) -> None:
        assert self.process is not None
        while self.process.is_alive():
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
        if self._closing:
            return
        await asyncio.sleep(0.05)  # let the dispatcher read a last "fatal" message
        self._died(self.process.exitcode)

    def _died(self, exitcode: int | None) -> None:
        reason = f": {self._fatal}" if self._fatal else ""
        message = f"the engine process exited unexpectedly (exit code {exitcode}){reason}"
        logger.error("%s", message)
        self.stop_serving(message)
        for callback in self.on_death:
            callback(message)

    def stop_serving(self, message: str) -> None:
        """End every request now (its client gets a 503 with `message`), and refuse new ones
        with it: the engine died, or the shutdown drain ran out of time."""
        self.dead_message = message
        for listener in list(self.listeners.values()):
            listener(None)
        self.listeners.clear()
