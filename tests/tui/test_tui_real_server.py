"""The dashboard attached to a real `localradix serve` on the bundled model: a few requests
sharing a system prompt must show up in the running batch and move the cache hit rate."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util

import httpx
import pytest
from tui_fakes import screen_text

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio,
    pytest.mark.timeout(420),
    pytest.mark.skipif(
        importlib.util.find_spec("localradix.server.app") is None,
        reason="the server (localradix.server.app) is not there yet",
    ),
]

SYSTEM = (
    "You are a careful assistant for a hardware store. You know the stock of screws, nails, "
    "bolts, hinges and paint, and you answer in one short sentence, naming the aisle. "
) * 3


@pytest.fixture(scope="module")
def server():
    """Started the way bare `localradix` starts it: not waited for (the dashboard waits)."""
    from localradix.tui.main import start_server

    handle = start_server(argparse.Namespace(max_total_tokens=8192, model=None))
    yield handle
    handle.stop()


async def ask(client: httpx.AsyncClient, model: str, question: str, max_tokens: int) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    r = await client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()


async def test_batch_and_hit_rate_change_under_requests(server):
    from localradix.tui.main import make_app

    app = make_app(server.url, None, server=server)
    app.chat_max_tokens = 8
    seen_rows, seen_batch_text = 0, False
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause(0.5)
        assert f"starting the server (pid {server.pid})" in screen_text(app)
        for _ in range(3000):  # the model loads: up to 5 minutes on a busy CPU
            if app.connected or server.poll() is not None:
                break
            await pilot.pause(0.1)
        assert app.connected, f"server not up; log: {server.process.log_tail()}"
        assert "starting the server" not in screen_text(app)
        model = await app.model_name()
        assert app.stats.hit_rate_total is None  # a fresh server: nothing cached yet
        async with httpx.AsyncClient(base_url=server.url, timeout=240, trust_env=False) as client:
            await ask(client, model, "Where are the hinges?", 4)  # warms the cache
            burst = asyncio.gather(
                *(ask(client, model, f"Do you have {x}?", 24) for x in ("nails", "bolts", "paint"))
            )
            task = asyncio.ensure_future(burst)
            while not task.done():
                await pilot.pause(0.1)
                rows = len(app.stats.requests)
                if rows and not seen_batch_text:
                    text = screen_text(app)
                    seen_batch_text = any(s in text for s in ("decode", "prefill"))
                seen_rows = max(seen_rows, rows)
            replies = task.result()
        assert all(r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 for r in replies)
        await pilot.pause(1.0)
        assert seen_rows >= 1 and seen_batch_text, "the running batch never showed a request"
        assert app.stats.hit_rate_total and app.stats.hit_rate_total > 0.3
        assert any(v for v in app.trends.hit_series() if v), "no hit rate in the history"
        text = screen_text(app)
        assert "total –" not in text and "● live" in text

        await pilot.press("f")  # idle now: the flush goes through and the cache empties
        for _ in range(50):
            await pilot.pause(0.1)
            if app.stats.get("kv_cached") == 0:
                break
        assert [n.message for n in app._notifications][-1] == "radix cache flushed"
        assert app.stats.get("kv_cached") == 0

        await pilot.press("c")  # two chat turns: the second one's prompt comes from the cache
        for turn, question in enumerate(("Name a colour.", "And another one?"), start=1):
            await pilot.press(*question, "enter")
            for _ in range(1200):
                await pilot.pause(0.1)
                if len(app.screen.usages) == turn:
                    break
            assert len(app.screen.usages) == turn, screen_text(app)
        first, second = app.screen.usages
        assert second.cached_tokens and second.cached_tokens >= first.prompt_tokens - 1
        assert f"cached {second.cached_tokens} (" in screen_text(app)
