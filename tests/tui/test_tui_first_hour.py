"""What a new user reads: a server that wants an API key is not "unreachable", and the chat's
status line moves on once the first token arrives (issue 14, item 9)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tui_fake_server import FakeStatsServer
from tui_fakes import FixedProbe, ScriptedFeed, screen_text

from localradix.tui.api import ApiClient, ApiError, ChatDelta, ChatUsage
from localradix.tui.app import LocalRadixApp
from localradix.tui.chat import ChatScreen
from localradix.tui.feed import HttpFeed

pytestmark = pytest.mark.asyncio

FAST = dict(backoff=(0.05, 0.1), poll_interval=0.05, timeout=2.0)
NEEDS_KEY = "the server needs an API key: pass --api-key / set LOCALRADIX_API_KEY"


async def wait_for_text(app, pilot, needle: str, timeout: float = 10.0) -> str:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        await pilot.pause(0.05)
        text = screen_text(app)
        if needle in text or asyncio.get_running_loop().time() > deadline:
            return text


@pytest.fixture
def keyed_server():
    server = FakeStatsServer(api_key="sekret").start()
    yield server
    server.stop()


async def test_a_server_that_wants_a_key_is_not_called_unreachable(keyed_server):
    url = keyed_server.url
    app = LocalRadixApp(HttpFeed(url, **FAST), ApiClient(url), probe=FixedProbe())
    async with app.run_test(size=(160, 50)) as pilot:
        text = await wait_for_text(app, pilot, "API key")
        assert f"{url} answered: {NEEDS_KEY}" in text
        assert "cannot reach" not in text and "is `localradix serve` running" not in text


async def test_a_wrong_key_is_said_to_be_refused(keyed_server):
    url = keyed_server.url
    feed, api = HttpFeed(url, "wrong", **FAST), ApiClient(url, "wrong")
    app = LocalRadixApp(feed, api, probe=FixedProbe())
    async with app.run_test(size=(160, 50)) as pilot:
        text = await wait_for_text(app, pilot, "refused the API key")
        assert "the server refused the API key (HTTP 401): check --api-key" in text
        assert "cannot reach" not in text
    with pytest.raises(ApiError, match="refused the API key"):
        await api.flush_cache()
    with pytest.raises(ApiError, match="needs an API key"):
        async for _ in ApiClient(url).chat("m", [{"role": "user", "content": "hi"}]):
            pass
    events = [e async for e in ApiClient(url, "sekret").chat("m", [])]  # the right key works
    assert isinstance(events[-1], ChatUsage)


class GatedApi:
    """Chat replies one token at a time, each only when the test opens its gate."""

    url = "http://fake:8000"

    def __init__(self) -> None:
        self.gates = [asyncio.Event() for _ in range(3)]

    async def first_model(self) -> str | None:
        return "fake-model"

    async def chat(self, model, messages, max_tokens=512) -> AsyncIterator[Any]:
        for gate, word in zip(self.gates, ("Bonjour", " à", " tous"), strict=True):
            await gate.wait()
            yield ChatDelta(word)
        yield ChatUsage(prompt_tokens=12, cached_tokens=0, completion_tokens=3)


async def test_the_chat_status_changes_once_the_first_token_arrives():
    api = GatedApi()
    app = LocalRadixApp(ScriptedFeed(), api, probe=FixedProbe(), render_interval=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("c")
        await pilot.pause(0.1)
        assert isinstance(app.screen, ChatScreen)
        await pilot.click("#prompt")
        await pilot.press(*"salut", "enter")
        text = await wait_for_text(app, pilot, "waiting for the first token")
        assert "waiting for the first token" in text

        api.gates[0].set()  # one token in, more to come: the reply is streaming
        text = await wait_for_text(app, pilot, "streaming")
        assert "Bonjour" in text and "streaming… TTFT" in text
        assert "waiting for the first token" not in text

        for gate in api.gates[1:]:
            gate.set()
        text = await wait_for_text(app, pilot, "3 generated")
        assert "Bonjour à tous" in text and "prompt 12" in text
        assert "streaming" not in text and "waiting" not in text
