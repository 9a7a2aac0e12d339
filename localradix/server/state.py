"""What every route reads: the models (model_pool.py), metrics, and the lifecycle.

`ServerState` (at `app.state.server`) starts the default model's engine process and loads its
tokenizer (in parallel), and stops every engine on shutdown. Routes get a model's manager with
`await manager_for(request, model, keep_alive)`; `ready_manager()` is the default model's. Shutdown (SIGTERM/SIGINT, see launch.py) drains:
new requests get 503 with Retry-After while the ones in flight get up to --drain-timeout
seconds; whatever still runs then ends with a clear 503 (an SSE error event and `[DONE]` for a
stream), and only then does uvicorn stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from localradix.config import ServerArgs
from localradix.server.engine_client import EngineClient
from localradix.server.engine_process import DEFAULT_CORE
from localradix.server.errors import APIError
from localradix.server.metrics import ServerMetrics
from localradix.server.model_memory import plan_memory
from localradix.server.model_pool import ModelPool
from localradix.server.resident import Resident, State
from localradix.server.tokenizer_manager import TokenizerManager

logger = logging.getLogger("localradix.server")

DEATH_GRACE_S = 2.0  # keep answering 503 this long after the engine died, then exit non-zero
RESTART_WINDOW_S = 600.0  # --engine-restarts counts the restarts within this window
RESTART_BACKOFF_S = (0.5, 2.0, 5.0, 10.0, 30.0)  # before the 1st, 2nd, ... restart in the window
ABORT_FLUSH_S = 5.0  # after the drain deadline: time for the aborted responses to go out
SHUTDOWN_RETRY_AFTER_S = 5
SHUTTING_DOWN = "the server is shutting down; retry on a server that is running"
# Prompt text in the stats feed (engine.top_prefixes / engine.recent_misses).
PREVIEW_KEYS = {
    "top_prefixes": ("preview", "head"),
    "recent_misses": ("cached_text", "request_text", "before_text"),
}


def default_tokenizer(args: ServerArgs) -> Any:
    from localradix.loader.tokenizer_choice import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    if args.chat_template:
        tokenizer.chat_template = Path(args.chat_template).read_text(encoding="utf-8")
    return tokenizer


class ServerState:
    def __init__(
        self,
        args: ServerArgs,
        core_factory: str = DEFAULT_CORE,
        tokenizer_factory: Callable[[ServerArgs], Any] = default_tokenizer,
    ) -> None:
        self.args = args
        self.core_factory = core_factory
        self.tokenizer_factory = tokenizer_factory
        self.metrics = ServerMetrics()
        default = Resident("", args.served_model_name or "", self._new_client(args), 0, True)
        self.pool = ModelPool(args, default, self._new_client, self._load, plan_memory)
        self.started = time.time()
        self.exit_code = 0
        self.startup_error: str | None = None
        self.request_exit: Callable[[], None] = lambda: None  # set by whoever runs the server
        self.is_exiting: Callable[[], bool] = lambda: False
        self.draining = False
        self.active = 0  # POST requests being answered (the work a shutdown drains)
        self._idle = asyncio.Event()
        self._idle.set()
        self._stop_now = asyncio.Event()
        self._drain: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._restarts: list[float] = []  # monotonic times of the restarts in the window
        self.restarting: str | None = None  # why requests get 503 while the engine restarts
        self.engine_restarts = 0  # since the server started

    @property
    def client(self) -> EngineClient:
        """The default model's engine (the one `serve` started with)."""
        return self.pool.default.client

    @property
    def manager(self) -> TokenizerManager | None:
        return self.pool.default.manager

    def _new_client(self, args: ServerArgs) -> EngineClient:
        return EngineClient(args, self.core_factory)

    async def _load(self, resident: Resident) -> None:
        """Start a model's engine and load its tokenizer (in parallel)."""
        args = resident.client.args
        tok = asyncio.ensure_future(asyncio.to_thread(self.tokenizer_factory, args))
        eng = asyncio.ensure_future(resident.client.start())
        try:
            tokenizer, info = await asyncio.gather(tok, eng)
        except BaseException:
            for task in (tok, eng):
                task.cancel()
            resident.client.close_sync()
            raise
        resident.manager = TokenizerManager(resident.client, tokenizer, args, self.metrics)
        resident.manager.names = resident.names  # the names the pool routes here
        resident.display = info["name"]
        manager = resident.manager
        logger.info(
            "loaded '%s' (tool-call parser: %s, reasoning parser: %s)",
            info["name"],
            manager.tool_parser or "none",
            manager.reasoning_parser or "none",
        )

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        from localradix.server.http_protocol import quiet_fd_exhaustion

        quiet_fd_exhaustion(self._loop)
        default = self.pool.default
        try:
            await self._load(default)
        except BaseException as exc:
            self.startup_error = str(exc) or type(exc).__name__
            self.exit_code = 1
            logger.error("startup failed: %s", self.startup_error)
            raise
        default.state = State.READY
        self.client.on_death.append(self._engine_died)
        self.pool.started()
        logger.info("serving '%s' on http://%s:%d", default.display, self.args.host, self.args.port)

    async def stop(self) -> None:
        await self.pool.close()

    def close_sync(self) -> None:
        self.pool.close_sync()

    def _engine_died(self, message: str) -> None:
        """Restart the default model's engine (with backoff), or exit non-zero once
        --engine-restarts restarts within RESTART_WINDOW_S are spent (or while draining)."""
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S]
        if self.draining or len(self._restarts) >= self.args.engine_restarts:
            if self.args.engine_restarts and not self.draining:
                logger.error(
                    "the engine died %d times within %.0f minutes: giving up (exit 1)",
                    len(self._restarts) + 1,
                    RESTART_WINDOW_S / 60,
                )
            self.exit_code = 1
            asyncio.get_running_loop().call_later(DEATH_GRACE_S, self.request_exit)
            return
        delay = RESTART_BACKOFF_S[min(len(self._restarts), len(RESTART_BACKOFF_S) - 1)]
        self._restarts.append(now)
        self.restarting = f"{message}; restarting it (the cache comes back cold)"
        logger.warning("%s; restarting it in %g s", message, delay)
        asyncio.ensure_future(self._restart(delay))

    async def _restart(self, delay: float) -> None:
        await asyncio.sleep(delay)
        default, manager = self.pool.default, self.manager
        assert manager is not None
        dead, client = default.client, self._new_client(self.args)
        dead.close_sync()  # its process is gone: release its sockets and folder
        default.client = manager.client = client
        try:
            await client.start()
        except Exception as exc:  # counts as another death: backoff, or give up
            client.close_sync()
            self._engine_died(f"the engine failed to restart: {exc}")
            return
        client.on_death.append(self._engine_died)
        self.restarting = None
        self.engine_restarts += 1
        logger.info("the engine is back (restart %d); serving again", self.engine_restarts)

    def unavailable(self) -> APIError | None:
        """Why requests cannot be served now (None: they can)."""
        if self.draining:
            return APIError(
                503, SHUTTING_DOWN, headers={"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)}
            )
        if self.restarting is not None:
            return APIError(503, self.restarting, headers={"Retry-After": "2"})
        if self.manager is None or not self.client.alive:
            return APIError(503, self.client.dead_message or "the server is still starting")
        return None

    def ready_manager(self) -> TokenizerManager:
        """The default model's manager (503 while it cannot serve)."""
        err = self.unavailable()
        if err is not None:
            raise err
        assert self.manager is not None
        return self.manager

    async def manager_for(
        self, request: Any, model: str | None, keep_alive: float | str | None = None
    ) -> TokenizerManager:
        """The manager of the model the request names (loaded on demand; the default one when
        it names none), held until its response is sent; 503 while the server cannot serve."""
        self.ready_manager()
        return await self.pool.acquire(model, keep_alive, request.scope)

    # ---- shutdown: drain, then stop ------------------------------------------------------

    def request_shutdown(self) -> bool:
        """From a signal handler: start the drain, or (a second signal) end it now. False
        before the server started (the caller then exits the usual way)."""
        if self._loop is None or self.manager is None:
            return False
        self._loop.call_soon_threadsafe(self._shutdown_requested)
        return True

    def _shutdown_requested(self) -> None:
        if self._drain is None:
            self.draining = True
            self._drain = asyncio.ensure_future(self._drain_then_exit())
        else:
            self._stop_now.set()

    async def _drain_then_exit(self) -> None:
        timeout = self.args.drain_timeout
        if self.active:
            logger.info(
                "shutting down: %d request(s) in flight get up to %g s to finish; new requests "
                "get 503 (signal again to end them now)",
                self.active,
                timeout,
            )
        if not await self._until_idle(timeout, stoppable=True):
            logger.warning("shutting down: ending %d request(s) with a 503 error", self.active)
            for resident in self.pool.residents:
                resident.client.stop_serving(SHUTTING_DOWN)
            await self._until_idle(ABORT_FLUSH_S)
        logger.info("shutting down")
        self.request_exit()

    async def _until_idle(self, timeout: float, stoppable: bool = False) -> bool:
        waits = [asyncio.ensure_future(self._idle.wait())]
        if stoppable:
            waits.append(asyncio.ensure_future(self._stop_now.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return self.active == 0

    def enter(self) -> None:
        self.active += 1
        self._idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    def stats_payload(self, previews: bool = True) -> dict[str, Any]:
        stats = self.client.stats
        m = self.metrics
        return {
            "model": self.client.info,
            "models": self.pool.describe(),
            "uptime_s": time.time() - self.started,
            "engine_alive": self.client.alive,
            "engine_pid": self.client.pid,
            "draining": self.draining,
            "engine": stats if stats is None or previews else _without_previews(stats),
            "server": {
                "in_flight": self.manager.in_flight if self.manager else 0,
                "requests_total": sum(m.requests.values()),
                "requests_by_finish_reason": m.requests,
                "errors_by_status": m.errors,
                "prompt_tokens_total": m.prompt_tokens,
                "generated_tokens_total": m.generated_tokens,
                "cached_tokens_total": m.cached_tokens,
                "cache_hit_rate": m.cache_hit_rate,
            },
            "throughput": {
                "prefill_tokens_per_s": stats.prefill_tokens_per_s if stats else 0.0,
                "decode_tokens_per_s": stats.decode_tokens_per_s if stats else 0.0,
            },
        }


def _without_previews(stats: Any) -> dict[str, Any]:
    data = msgspec.to_builtins(stats)
    for table, keys in PREVIEW_KEYS.items():
        data[table] = [{k: v for k, v in row.items() if k not in keys} for row in data[table]]
    return data
