"""Test doubles for the TUI: a scripted feed, a recording API, and sample snapshots."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

from localradix.tui.api import ApiError, ChatDelta, ChatUsage
from localradix.tui.feed import FeedEvent
from localradix.tui.system import SystemSample

T0 = 1_700_000_000.0


def snapshot(**engine: Any) -> dict[str, Any]:
    """A /v1/stats payload with round, recognisable numbers; `engine` overrides fields."""
    data: dict[str, Any] = {
        "model": {
            "name": "SmolLM2-135M-Instruct",
            "backend": "cpu",
            "device": "cpu",
            "dtype": "float32",
            "context_length": 8192,
            "kv_total_tokens": 131072,
        },
        "uptime_s": 754.0,
        "time": T0,
        "engine": {
            "running": 2,
            "queued": 7,
            "kv_total": 131072,
            "kv_used": 4096,
            "kv_cached": 32768,
            "kv_free": 94208,
            "cache_hit_tokens": 9000,
            "cache_miss_tokens": 1000,
            "prompt_tokens_total": 10000,
            "generated_tokens_total": 2500,
            "retractions": 3,
            "prefill_tokens_per_s": 1234.0,
            "decode_tokens_per_s": 56.0,
            "requests": [
                {
                    "id": "chatcmpl-aaaa1111",
                    "state": "decode",
                    "prompt_tokens": 1072,
                    "cached_tokens": 1024,
                    "generated_tokens": 20,
                    "ttft_s": 0.25,
                    "age_s": 1.25,
                    "retractions": 0,
                },
                {
                    "id": "chatcmpl-bbbb2222",
                    "state": "prefill",
                    "prompt_tokens": 1100,
                    "cached_tokens": 0,
                    "generated_tokens": 0,
                    "ttft_s": None,
                    "age_s": 0.1,
                    "retractions": 0,
                },
            ],
            "top_prefixes": [
                {"tokens": 1024, "hits": 31, "locked": True, "preview": "You are a [tool] agent."},
                {"tokens": 300, "hits": 2, "locked": False, "preview": "Summarise this document"},
            ],
            "recent_misses": [
                {
                    "rid": "chatcmpl-cccc3333",
                    "prompt_tokens": 1100,
                    "matched_tokens": 0,
                    "reason": "new system prompt: 'You are a pirate'",
                },
            ],
        },
    }
    data["engine"].update(engine)
    return data


def advance(data: dict[str, Any], seconds: float, hit: int, miss: int) -> dict[str, Any]:
    """The next snapshot: `seconds` later with `hit` / `miss` more prompt tokens."""
    nxt = copy.deepcopy(data)
    nxt["time"] += seconds
    nxt["uptime_s"] += seconds
    nxt["engine"]["cache_hit_tokens"] += hit
    nxt["engine"]["cache_miss_tokens"] += miss
    return nxt


class ScriptedFeed:
    """A feed the test pushes events into."""

    url = "http://fake:8000"

    def __init__(self) -> None:
        self.queue: asyncio.Queue[FeedEvent] = asyncio.Queue()

    def push(self, event: FeedEvent) -> None:
        self.queue.put_nowait(event)

    async def events(self) -> AsyncIterator[FeedEvent]:
        while True:
            yield await self.queue.get()


class RecordingApi:
    """An ApiClient double: flush refuses while `busy`; chat replies with fixed words."""

    url = "http://fake:8000"

    def __init__(self) -> None:
        self.busy = False
        self.flushes = 0
        self.chats: list[list[dict[str, str]]] = []

    async def flush_cache(self) -> str:
        self.flushes += 1
        if self.busy:
            raise ApiError("flush refused: cannot flush the cache while requests are running")
        return "radix cache flushed"

    async def first_model(self) -> str | None:
        return "fake-model"

    async def chat(self, model, messages, max_tokens=512) -> AsyncIterator[Any]:
        self.chats.append(list(messages))
        for word in ("Hello", " there", "!"):
            await asyncio.sleep(0)
            yield ChatDelta(word)
        yield ChatUsage(prompt_tokens=40, cached_tokens=32, completion_tokens=3)


class FixedProbe:
    local = True

    def sample(self) -> SystemSample:
        return SystemSample(
            cpu_percent=42.0, ram_used=3.5 * 2**30, ram_total=16 * 2**30, source="local"
        )


def screen_text(app: Any) -> str:
    """The current screen as plain text (what a user reads), for assertions."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(
        width=width, height=height, file=io.StringIO(), force_terminal=True,
        color_system="truecolor", record=True, legacy_windows=False, safe_box=False,
    )  # fmt: skip
    console.print(
        app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    )
    return console.export_text()
