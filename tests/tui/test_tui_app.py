"""Pilot tests of the dashboard against a scripted feed: panels show the numbers they are
given, keys do what the footer says, a lost server shows a banner and never a traceback."""

from __future__ import annotations

import pytest
from tui_fakes import T0, FixedProbe, RecordingApi, ScriptedFeed, advance, screen_text, snapshot

from localradix.tui.app import LocalRadixApp
from localradix.tui.chat import ChatScreen
from localradix.tui.feed import Connected, Disconnected, Snapshot
from localradix.tui.help import HelpScreen
from localradix.tui.tables import BatchTable

pytestmark = pytest.mark.asyncio


def make_app(api=None) -> tuple[LocalRadixApp, ScriptedFeed]:
    feed = ScriptedFeed()
    app = LocalRadixApp(
        feed, api or RecordingApi(), probe=FixedProbe(), clock=lambda: T0, render_interval=0
    )
    return app, feed


async def settle(pilot, seconds: float = 0.1) -> None:
    await pilot.pause(seconds)
    await pilot.pause()


def notices(app) -> list[str]:
    return [n.message for n in app._notifications]


async def test_panels_render_the_numbers_they_are_given():
    app, feed = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        snap = snapshot()
        feed.push(Connected(feed.url, "sse"))
        feed.push(Snapshot(snap))
        for _ in range(3):
            snap = advance(snap, 1, hit=90, miss=10)
            feed.push(Snapshot(snap))
        await settle(pilot)
        text = screen_text(app)
    for expected in [
        "SmolLM2-135M-Instruct", "cpu · cpu · float32", "up 0:12:37", "● live",
        "KV memory · 131k", "used      4096    3%", "cached   32.8k   25%",
        "free     94.2k   72%",
        "now 90%", "total 90%",  # 9270 / 10300 lifetime
        "prefill 1234/s", "decode  56/s",
        "running 2", "waiting 7", "retractions 3", "CPU 42%", "RAM 3.5G/16.0G",
        "aaaa1111", "decode", "1072", "1024", "250ms", "bbbb2222", "prefill",
        "You are a [tool] agent.", "Summarise this document", "●", "○",
        "cccc3333", "0/1100", "new system prompt: 'You are a pirate'",
    ]:  # fmt: skip
        assert expected in text, f"{expected!r} not on screen:\n{text}"
    assert "Traceback" not in text


async def test_kv_panel_shows_weights_and_kv_memory_apart():
    app, feed = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        snap = snapshot()
        snap["model"].update(weight_bytes=110 * 2**20, kv_bytes=720 * 2**20)
        feed.push(Connected(feed.url, "sse"))
        feed.push(Snapshot(snap))
        await settle(pilot)
        text = screen_text(app)
    assert "weights 110M · KV 720M" in text, text


async def test_kv_panel_title_counts_pinned_prefixes():
    app, feed = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        snap = snapshot()
        snap["engine"]["kv_pinned"] = 1536
        feed.push(Connected(feed.url, "sse"))
        feed.push(Snapshot(snap))
        await settle(pilot)
        text = screen_text(app)
    assert "KV memory · 131k · 1536 pinned" in text, text


async def test_status_line_grows_a_row_for_the_cache_tiers():
    app, feed = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        feed.push(Connected(feed.url, "sse"))
        feed.push(Snapshot(snapshot(kv_tiers={})))
        await settle(pilot)
        assert "KV tiers" not in screen_text(app)
        assert app.status.size.height == 1
        tiers = {"promoted_tokens": 34_000, "promotions": 12, "load_seconds": 1.3}
        tiers.update(disk_bytes=int(1.2 * 2**30), disk_budget=16 * 2**30, host_bytes=2**31)
        feed.push(Snapshot(snapshot(kv_tiers=tiers)))
        await settle(pilot)
        text = screen_text(app)
        assert app.status.size.height == 2
        assert "running 2 │ waiting 7" in text, text  # the first line stays
        line = "KV tiers host 2.0G · disk 1.2G of 16.0G · 34k tokens loaded back (12 requests)"
        assert f"{line} · 1.30s loading" in text, text
        feed.push(Snapshot(snapshot()))  # the tiers went away (another server)
        await settle(pilot)
        assert "KV tiers" not in screen_text(app)
        assert app.status.size.height == 1


async def test_missing_keys_render_as_dashes():
    app, feed = make_app()
    async with app.run_test() as pilot:
        feed.push(Snapshot({"engine": {"requests": [{"id": "x1", "state": None}]}}))
        feed.push(Snapshot("not a snapshot at all"))
        feed.push(Snapshot({"engine": {"running": "many", "requests": [{"id": "x2"}]}}))
        await settle(pilot)
        text = screen_text(app)
    assert "running – │ waiting –" in text
    assert "x2" in text and "now idle  total –" in text
    assert "up –" in text


async def test_pause_freezes_the_panels_until_resumed():
    app, feed = make_app()
    async with app.run_test() as pilot:
        feed.push(Snapshot(snapshot(running=2)))
        await settle(pilot)
        await pilot.press("p")
        feed.push(Snapshot(snapshot(running=5, queued=11)))
        await settle(pilot)
        text = screen_text(app)
        assert "PAUSED" in text and "running 2" in text and "waiting 11" not in text
        await pilot.press("p")
        await settle(pilot)
        text = screen_text(app)
        assert "PAUSED" not in text and "running 5" in text and "waiting 11" in text


async def test_flush_is_refused_while_requests_run():
    api = RecordingApi()
    app, feed = make_app(api)
    async with app.run_test(notifications=True) as pilot:
        api.busy = True
        await pilot.press("f")
        await settle(pilot)
        assert any("refused" in m for m in notices(app))
        api.busy = False
        await pilot.press("f")
        await settle(pilot)
        assert notices(app)[-1] == "radix cache flushed"
        assert api.flushes == 2


async def test_help_opens_and_closes():
    app, _ = make_app()
    async with app.run_test() as pilot:
        await pilot.press("question_mark")
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        assert "flush the radix cache" in screen_text(app)
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.slow  # seconds of e2e work
async def test_chat_streams_a_reply_and_shows_its_cached_tokens():
    api = RecordingApi()
    app, _ = make_app(api)
    async with app.run_test() as pilot:
        await pilot.press("c")
        await settle(pilot)
        assert isinstance(app.screen, ChatScreen)
        await pilot.click("#system")
        await pilot.press(*"Be brief.")
        await pilot.click("#prompt")
        await pilot.press(*"quick question", "enter")  # q and c type, they do not quit
        await settle(pilot, 0.3)
        text = screen_text(app)
        assert "Hello there!" in text
        assert "prompt 40" in text and "cached 32 (80%)" in text and "3 generated" in text
        assert api.chats[0] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "quick question"},
        ]
        await pilot.press(*"again", "enter")
        await settle(pilot, 0.3)
        assert [m["role"] for m in api.chats[1]] == ["system", "user", "assistant", "user"]
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, ChatScreen)
        await pilot.press("c")  # the conversation is still there
        await settle(pilot)
        assert "Hello there!" in screen_text(app)


async def test_quit_key_exits():
    app, _ = make_app()
    async with app.run_test() as pilot:
        await pilot.press("q")
        await settle(pilot)
        assert not app.is_running


async def test_theme_toggles_between_dark_and_light():
    app, feed = make_app()
    async with app.run_test() as pilot:
        feed.push(Snapshot(snapshot()))
        await settle(pilot)
        await pilot.press("p")  # even a paused table takes the new theme's colours
        await pilot.press("t")
        await settle(pilot)
        assert app.theme == "textual-light"
        state = app.query_one(BatchTable).get_cell("0", "state")
        assert str(state) == "decode" and state.style == app.theme_variables["text-success"]
        await pilot.press("t")
        assert app.theme == "textual-dark"


async def test_banner_while_disconnected_then_cleared_on_reconnect():
    app, feed = make_app()
    async with app.run_test() as pilot:
        await settle(pilot)
        assert "cannot reach http://fake:8000" in screen_text(app)  # never connected yet
        feed.push(Snapshot(snapshot()))
        await settle(pilot)
        assert "cannot reach" not in screen_text(app)
        feed.push(Disconnected("connection refused", 2.0))
        await settle(pilot)
        text = screen_text(app)
        assert "lost the server at http://fake:8000: connection refused" in text
        assert "retrying in 2s" in text and "○ offline" in text
        feed.push(Snapshot(snapshot()))
        await settle(pilot)
        text = screen_text(app)
        assert "lost the server" not in text and "● live" in text


async def test_a_dead_engine_behind_a_live_api_shows_a_banner():
    app, feed = make_app()
    async with app.run_test() as pilot:
        feed.push(Snapshot({**snapshot(), "engine_alive": False}))
        await settle(pilot)
        assert "engine is not running" in screen_text(app)
        feed.push(Snapshot({**snapshot(), "engine_alive": True}))
        await settle(pilot)
        assert "engine is not running" not in screen_text(app)


class BrokenFeed:
    url = "http://broken:1"

    def __init__(self) -> None:
        self.calls = 0

    async def events(self):
        self.calls += 1
        yield Snapshot(snapshot())
        raise RuntimeError("decoder exploded")


@pytest.mark.slow  # seconds of e2e work
async def test_a_failing_feed_shows_a_banner_not_a_traceback():
    feed = BrokenFeed()
    app = LocalRadixApp(feed, RecordingApi(), probe=FixedProbe())
    async with app.run_test() as pilot:
        await settle(pilot, 0.2)
        assert "stats feed failed: decoder exploded" in screen_text(app)
        await settle(pilot, 1.2)
        assert feed.calls >= 2 and app.is_running  # it retried


async def test_hit_rate_keeps_the_last_burst_readable_when_idle():
    app, feed = make_app()
    async with app.run_test() as pilot:
        snap = snapshot()
        feed.push(Snapshot(snap))
        snap = advance(snap, 1, hit=80, miss=20)
        feed.push(Snapshot(snap))
        await settle(pilot)
        assert "now 80%" in screen_text(app)
        for _ in range(30):  # half a minute without prompts
            snap = advance(snap, 1, hit=0, miss=0)
            feed.push(Snapshot(snap))
        await settle(pilot)
        text = screen_text(app)
        assert "last 80%" in text and "now" not in text.split("Cache hit rate")[1][:60]


@pytest.mark.slow  # seconds of e2e work
async def test_the_dashboard_keeps_updating_behind_the_chat_and_help_screens():
    app, feed = make_app()
    async with app.run_test() as pilot:
        await pilot.press("c")
        await settle(pilot)
        feed.push(Disconnected("connection refused", 1.0))
        feed.push(Snapshot(snapshot(running=6)))
        await pilot.press("escape", "question_mark")
        feed.push(Snapshot(snapshot(running=4, queued=12)))
        await settle(pilot)
        await pilot.press("escape")
        await settle(pilot)
        text = screen_text(app)
        assert "running 4" in text and "waiting 12" in text and "feed failed" not in text


async def test_snapshots_faster_than_the_render_interval_are_coalesced():
    feed = ScriptedFeed()
    app = LocalRadixApp(feed, RecordingApi(), probe=FixedProbe(), render_interval=0.3)
    renders = []
    async with app.run_test() as pilot:
        await settle(pilot)
        original = app.render_view
        app.render_view = lambda force=False: (renders.append(1), original(force))  # type: ignore[method-assign]
        snap = snapshot()
        for running in range(1, 21):  # twenty snapshots at once
            snap = advance(snap, 0.01, hit=1, miss=1)
            snap["engine"]["running"] = running
            feed.push(Snapshot(snap))
        await pilot.pause(0.1)
        assert len(renders) <= 1
        await pilot.pause(0.4)
        assert 1 <= len(renders) <= 2 and "running 20" in screen_text(app)  # the last one wins
        assert app.snapshots == 20  # and the history saw every one
