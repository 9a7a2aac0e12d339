"""One model the server holds (or is loading, or unloading): its engine client, tokenizer
manager, the names that led to it, its memory and when it may be unloaded."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from localradix.config import ServerArgs
from localradix.server.engine_client import EngineClient
from localradix.server.errors import APIError
from localradix.server.model_memory import MemoryPlan, resident_memory
from localradix.server.tokenizer_manager import TokenizerManager


class State(str, enum.Enum):
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


@dataclass(eq=False)
class Resident:
    key: str  # the model's resolved path ("" until the default model reports it)
    display: str  # the name it is served as
    client: EngineClient
    estimate: int  # bytes, before the engine reports the real figure
    pinned: bool = False
    keep_alive: float | None = None  # idle seconds before unloading; None or < 0: never
    names: set[str] = field(default_factory=set)  # request names that route here
    manager: TokenizerManager | None = None
    state: State = State.LOADING
    error: str | None = None
    leases: int = 0  # requests holding it (until their response is sent)
    last_used: float = field(default_factory=time.time)
    _task: asyncio.Task[None] | None = None

    @classmethod
    def create(
        cls,
        args: ServerArgs,
        new_client: Callable[[ServerArgs], EngineClient],
        source: Any,
        plan: MemoryPlan,
        pinned: bool,
        keep_alive: float | None,
    ) -> Resident:
        """A model from the store, its engine to start with its own KV pool (the planned one
        unless --max-total-tokens fixes it)."""
        model_args = args.replace(
            model=str(source.path),
            served_model_name=source.name,
            max_total_tokens=args.max_total_tokens or plan.kv_tokens,
        )
        client = new_client(model_args)
        key = str(source.path.resolve())
        return cls(key, source.name, client, plan.total, pinned, keep_alive, {source.name})

    # ---- loading -------------------------------------------------------------------------

    def begin(self, start: Awaitable[Any]) -> None:
        self._task = asyncio.create_task(self._load(start), name=f"load {self.display}")

    async def _load(self, start: Awaitable[Any]) -> None:
        try:
            await start
        except Exception as exc:
            self.failed(str(exc) or type(exc).__name__)
            await self.client.close()
            return
        self.state = State.READY
        self.client.on_death.append(self.failed)
        self.touch()

    def failed(self, message: str) -> None:
        self.state, self.error = State.FAILED, message

    async def wait_loaded(self) -> None:
        if self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        if self.state != State.READY:
            raise APIError(503, self.unavailable_message())

    def unavailable_message(self) -> str:
        if self.state == State.FAILED:
            return f"the model '{self.display}' failed to load: {self.error}"
        return f"the model '{self.display}' is {self.state.value}; retry in a moment"

    # ---- use -----------------------------------------------------------------------------

    def touch(self) -> None:
        self.last_used = time.time()

    def release(self) -> None:
        self.leases -= 1
        self.touch()

    @property
    def live(self) -> bool:
        """It holds (or is about to hold) memory."""
        return self.state != State.FAILED

    @property
    def busy(self) -> bool:
        return self.leases > 0 or bool(self.manager and self.manager.in_flight)

    @property
    def memory(self) -> int:
        info = self.client.model_info
        return resident_memory(info, self.estimate) if info else self.estimate

    @property
    def idle_for(self) -> float:
        return time.time() - self.last_used

    @property
    def expires_at(self) -> float | None:
        """When it unloads if nothing uses it (None: never)."""
        if self.pinned or self.keep_alive is None or self.keep_alive < 0:
            return None
        return (time.time() if self.busy else self.last_used) + self.keep_alive

    def expired(self) -> bool:
        expires = self.expires_at
        return (
            self.state == State.READY
            and not self.busy
            and expires is not None
            and time.time() >= expires
        )

    def describe(self) -> dict[str, Any]:
        info = self.client.model_info
        return {
            "name": self.display,
            "state": self.state.value,
            "pinned": self.pinned,
            "in_flight": self.manager.in_flight if self.manager else 0,
            "memory_bytes": self.memory,
            "weight_bytes": info.weight_bytes if info else None,
            "kv_bytes": info.kv_bytes if info else None,
            "backend": info.backend if info else None,
            "device": info.device if info else None,
            "context_length": info.context_length if info else None,
            "path": info.path if info else self.key,
            "expires_at": self.expires_at,
            "error": self.error,
        }
