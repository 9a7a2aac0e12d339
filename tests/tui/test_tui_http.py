"""The TUI over real HTTP against a fake server: SSE and polling, auth, flush, chat, and the
banner + automatic reconnection when the server is unreachable or goes away."""

from __future__ import annotations

import asyncio

import pytest
from tui_fake_server import FakeStatsServer, free_port
from tui_fakes import FixedProbe, screen_text, snapshot

from localradix.tui.api import ApiClient, ApiError, ChatDelta, ChatUsage
from localradix.tui.app import LocalRadixApp
from localradix.tui.feed import Connected, Disconnected, HttpFeed, Snapshot

pytestmark = pytest.mark.asyncio

FAST = dict(backoff=(0.05, 0.1), poll_interval=0.05, timeout=2.0)


async def take(feed: HttpFeed, n: int, timeout: float = 10.0) -> list:
    events = []

    async def collect() -> None:
        async for event in feed.events():
            events.append(event)
            if len(events) >= n:
                return

    await asyncio.wait_for(collect(), timeout)
    return events


async def test_sse_feed_delivers_snapshots(fake_server):
    events = await take(HttpFeed(fake_server.url, **FAST), 3)
    assert events[0] == Connected(fake_server.url, "sse")
    assert all(isinstance(e, Snapshot) for e in events[1:])
    assert events[1].data["engine"]["kv_used"] == 4096


async def test_feed_polls_a_server_without_the_stream():
    server = FakeStatsServer(sse=False).start()
    try:
        feed = HttpFeed(server.url, **FAST)
        events = await take(feed, 3)
        assert events[0] == Connected(server.url, "poll") and feed.sse is False
        assert isinstance(events[2], Snapshot)
    finally:
        server.stop()


async def test_feed_reports_a_missing_api_key_and_uses_a_given_one():
    server = FakeStatsServer(api_key="sekret").start()
    try:
        (event,) = await take(HttpFeed(server.url, **FAST), 1)
        assert isinstance(event, Disconnected) and "--api-key" in event.reason
        events = await take(HttpFeed(server.url, "sekret", **FAST), 2)
        assert isinstance(events[1], Snapshot)
    finally:
        server.stop()


async def test_feed_reports_an_unreachable_server_and_retries():
    feed = HttpFeed(f"http://127.0.0.1:{free_port()}", **FAST)
    events = await take(feed, 3)
    assert all(isinstance(e, Disconnected) for e in events)
    assert events[0].reason == "connection refused"
    assert [e.retry_in for e in events] == [0.05, 0.1, 0.1]


async def test_flush_and_chat_over_http(fake_server):
    api = ApiClient(fake_server.url)
    assert await api.flush_cache() == "radix cache flushed"
    fake_server.busy = True
    with pytest.raises(ApiError, match="refused: cannot flush the cache while requests"):
        await api.flush_cache()
    assert await api.first_model() == "fake-model"
    events = [e async for e in api.chat("fake-model", [{"role": "user", "content": "hi"}])]
    assert "".join(e.text for e in events if isinstance(e, ChatDelta)) == "Ahoy, matey"
    assert events[-1] == ChatUsage(prompt_tokens=50, cached_tokens=45, completion_tokens=3)
    body = fake_server.chats[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_api_errors_are_one_line_messages():
    api = ApiClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ApiError, match="flush failed: connection refused"):
        await api.flush_cache()
    assert await api.first_model() is None


async def wait_for_text(app, pilot, needle: str, timeout: float = 10.0) -> str:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        await pilot.pause(0.05)
        text = screen_text(app)
        if needle in text or asyncio.get_running_loop().time() > deadline:
            return text


async def test_app_shows_a_banner_and_reconnects_when_the_server_comes_and_goes():
    server = FakeStatsServer()  # not started yet: nothing listens on its port
    app = LocalRadixApp(HttpFeed(server.url, **FAST), ApiClient(server.url), probe=FixedProbe())
    try:
        async with app.run_test() as pilot:
            text = await wait_for_text(app, pilot, "cannot reach")
            assert f"cannot reach {server.url} (connection refused" in text
            assert "Traceback" not in text

            server.start()
            text = await wait_for_text(app, pilot, "used      4096")
            assert "cannot reach" not in text and "● live" in text

            server.stop()
            text = await wait_for_text(app, pilot, "lost the server")
            assert f"lost the server at {server.url}" in text and "○ offline" in text

            server.stats = snapshot(kv_used=5555)
            server.start()
            text = await wait_for_text(app, pilot, "5555")
            assert "lost the server" not in text and "used      5555" in text
    finally:
        server.stop()


async def test_app_flush_key_against_a_busy_server(fake_server):
    fake_server.busy = True
    url = fake_server.url
    app = LocalRadixApp(HttpFeed(url, **FAST), ApiClient(url), probe=FixedProbe())
    async with app.run_test(notifications=True) as pilot:
        await pilot.press("f")
        for _ in range(300):
            await pilot.pause(0.05)
            if fake_server.flushes and list(app._notifications):
                break
        notices = [n.message for n in app._notifications]
        assert fake_server.flushes == 1, notices
        assert notices[-1].startswith("flush refused: cannot flush the cache while requests")
