"""The models one server holds: an engine process and a tokenizer manager per loaded model.

Requests are routed by their `model` field: a loaded model's served name or a name that already
led to it, else a store name (alias, `org/name:QUANT`, repo id, or the path `ls` shows), which
loads that model (concurrent requests for it wait on the same load). Anything else, or no name,
goes to the default model (the one `serve` started with), which answers an unknown name with
its usual 404. Files that are not in the store are never loaded on a client's say-so.

Limits: at most `--max-loaded-models` at once, and weights + KV of all of them within
`--memory-budget`. Making room unloads the least recently used idle model; a model that cannot
fit (alone, or because every other one is busy or pinned) is a 503 naming the budget. A model
unloads once idle for its keep_alive (`--keep-alive`, or the request's: 0 = after this request,
negative = never); the default model and `--pin` ones never unload.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from localradix.config import ServerArgs
from localradix.server.core.keep_alive import keep_alive_seconds
from localradix.server.engine_client import EngineClient
from localradix.server.errors import APIError, bad_request
from localradix.server.model_list import model_key, store_source
from localradix.server.model_memory import MemoryPlan, default_budget, gib, parse_size
from localradix.server.resident import Resident, State
from localradix.server.tokenizer_manager import TokenizerManager

logger = logging.getLogger("localradix.server")

REAP_INTERVAL_S = 0.25
BUSY_RETRY_AFTER_S = 10
LEASES = "localradix.leases"  # ASGI scope key: releases run when the response is sent


class ModelPool:
    def __init__(
        self,
        args: ServerArgs,
        default: Resident,
        new_client: Callable[[ServerArgs], EngineClient],
        start: Callable[[Resident], Awaitable[Any]],
        plan: Callable[[Any, ServerArgs, Any, int], MemoryPlan],
    ) -> None:
        self.args = args
        self.default = default
        self.residents: list[Resident] = [default]
        self._new_client = new_client
        self._start = start  # async: spawn the engine, load the tokenizer, set `manager`
        self._plan = plan  # (ModelSource, args, like: ModelInfo, room) -> MemoryPlan, in a thread
        self._lock = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None
        self._preloads: list[asyncio.Task[None]] = []
        self.keep_alive = keep_alive_seconds(args.keep_alive)
        self.budget = parse_size(args.memory_budget) if args.memory_budget else 0

    # ---- lifecycle -----------------------------------------------------------------------

    def started(self) -> None:
        """The default model is ready: size the budget from its device, start the reaper,
        load the pinned models in the background."""
        info = self.default.client.loaded
        self.budget = self.budget or default_budget(info.device)
        self.default.names.add(info.name)
        self.default.key = model_key(Path(info.path))
        logger.info(
            "models: up to %d loaded within %s (weights + KV); idle ones unload after %s",
            self.args.max_loaded_models,
            gib(self.budget),
            "never" if self.keep_alive is None or self.keep_alive < 0 else f"{self.keep_alive:g} s",
        )
        if self.default.memory > self.budget:
            logger.warning(
                "the default model alone takes %s of the %s memory budget: no other model can "
                "load; raise --memory-budget",
                gib(self.default.memory),
                gib(self.budget),
            )
        self._reaper = asyncio.create_task(self._reap(), name="model-reaper")
        self._preloads = [
            asyncio.create_task(self._preload(name), name=f"pin {name}") for name in self.args.pin
        ]

    async def _preload(self, name: str) -> None:
        try:
            resident = await self._route(name, pin=True)
        except APIError as exc:
            logger.error("--pin %s: %s", name, exc.message)
            return
        if resident is self.default:
            logger.warning("--pin %s: that is the default model, which stays loaded anyway", name)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        await asyncio.gather(*(r.client.close() for r in self.residents), return_exceptions=True)

    def close_sync(self) -> None:
        for r in self.residents:
            r.client.close_sync()

    # ---- routing -------------------------------------------------------------------------

    async def acquire(
        self, model: str | None, keep_alive: float | str | None, scope: MutableMapping[str, Any]
    ) -> TokenizerManager:
        """The manager of the model `model` names (loading it if need be), held until the
        response in `scope` has been sent."""
        keep = keep_alive_seconds(keep_alive)
        resident = await self._route(model or None)
        if resident.manager is None:
            raise APIError(503, resident.unavailable_message())
        if not resident.pinned:  # each request sets it anew, as Ollama does
            resident.keep_alive = self.keep_alive if keep is None else keep
        resident.leases += 1
        resident.touch()
        scope.setdefault(LEASES, []).append(resident.release)
        return resident.manager

    async def _route(self, model: str | None, pin: bool = False) -> Resident:
        if model is None:
            return self.default
        resident = self._by_name(model)
        if resident is None:
            from localradix.store import StoreError

            try:
                found = await asyncio.to_thread(store_source, model)
            except StoreError as exc:
                raise bad_request(str(exc), "model") from None
            if found is None:
                return self.default  # not a name we know: the default model says 404
            resident = await self._resident_for(model, found, pin)
        resident.pinned = resident.pinned or pin
        await resident.wait_loaded()
        return resident

    def _by_name(self, model: str) -> Resident | None:
        wanted = model.removesuffix(":latest").lower()
        for r in self.residents:
            if r.state != State.FAILED and wanted in {n.lower() for n in r.names}:
                r.names.add(model)  # as spelled: the dialects check the name they are given
                return r
        return None

    async def _resident_for(self, model: str, source: Any, pin: bool) -> Resident:
        key = model_key(source.path)
        async with self._lock:
            for r in self.residents:
                if r.key == key and r.state in (State.LOADING, State.READY):
                    r.names.add(model)
                    return r
            self.residents = [
                r for r in self.residents if not (r.key == key and r.state == State.FAILED)
            ]
            resident = await self._make_room_and_load(model, source, pin)
            resident.names.add(model)
            return resident

    async def _make_room_and_load(self, model: str, source: Any, pin: bool) -> Resident:
        staying = sum(r.memory for r in self.residents if r.live and (r.pinned or r.busy))
        like = self.default.client.loaded
        room = self.budget - staying
        try:
            plan = await asyncio.to_thread(self._plan, source, self.args, like, room)
        except Exception as exc:  # an unreadable config or header: say which model and why
            raise APIError(503, f"the model '{model}' cannot be loaded: {exc}") from None
        if plan.total > self.budget:
            raise APIError(
                503,
                f"the model '{model}' needs about {gib(plan.total)} (weights {gib(plan.weights)} "
                f"+ KV {gib(plan.kv_bytes)}) but the memory budget is {gib(self.budget)}: start "
                "the server with a larger --memory-budget, or use a smaller model or quant",
                code="model_too_large",
            )
        await self._make_room(model, plan.total)
        resident = Resident.create(self.args, self._new_client, source, plan, pin, self.keep_alive)
        self.residents.append(resident)
        resident.begin(self._start(resident))
        return resident

    async def _make_room(self, model: str, need: int) -> None:
        while True:
            live = [r for r in self.residents if r.live]
            used = sum(r.memory for r in live)
            if len(live) < self.args.max_loaded_models and used + need <= self.budget:
                return
            idle = [r for r in live if r.state == State.READY and not r.pinned and not r.busy]
            if not idle:
                raise self._no_room(model, need, live, used)
            await self._unload(min(idle, key=lambda r: r.last_used))

    def _no_room(self, model: str, need: int, live: list[Resident], used: int) -> APIError:
        names = ", ".join(f"{r.display} ({'pinned' if r.pinned else 'busy'})" for r in live)
        return APIError(
            503,
            f"cannot load the model '{model}' ({gib(need)}): the loaded models ({names}) use "
            f"{gib(used)} of the {gib(self.budget)} memory budget (at most "
            f"{self.args.max_loaded_models} loaded) and none is idle; retry when one is, or "
            "start the server with a larger --memory-budget or --max-loaded-models",
            code="no_room",
            headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
        )

    # ---- unloading -----------------------------------------------------------------------

    async def _unload(self, resident: Resident) -> None:
        logger.info("unloading %s (idle since %.0f s)", resident.display, resident.idle_for)
        resident.state = State.UNLOADING
        try:
            await resident.client.close()
        finally:
            if resident in self.residents:
                self.residents.remove(resident)

    async def unload_idle(self, key: str) -> bool:
        """Unload the model at `key` (a resolved path) if it is loaded and idle; False when it
        cannot go: the default model, or one serving requests."""
        async with self._lock:
            for r in [r for r in self.residents if r.key == key and r.live]:
                if r is self.default or r.busy:
                    return False
                await self._unload(r)
        return True

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            for r in [r for r in self.residents if r.expired()]:
                async with self._lock:
                    if r.expired():
                        try:
                            await self._unload(r)
                        except Exception:  # keep reaping the others
                            logger.exception("unloading %s failed", r.display)

    # ---- what the API lists --------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        """Per model: name, state, memory, expiry (the stats feed, /health, /api/ps)."""
        return [r.describe() for r in self.residents]

    def loaded_keys(self) -> set[str]:
        return {r.key for r in self.residents if r.live}


def check_pool_args(args: ServerArgs) -> str | None:
    """What makes the model-pool flags unusable, in one line (None: nothing)."""
    from localradix.server.model_memory import BudgetError

    if args.max_loaded_models < 1:
        return "--max-loaded-models must be at least 1"
    try:
        if args.memory_budget:
            parse_size(args.memory_budget)
        keep_alive_seconds(args.keep_alive)
    except BudgetError as exc:
        return str(exc)
    except APIError:
        return f"--keep-alive {args.keep_alive!r} is not a duration; try 300, 5m, 1h or -1"
    return None
