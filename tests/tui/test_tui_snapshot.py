"""SVG snapshot of the dashboard at 80x24 with a recorded feed.

The saved SVG lives in snapshots/; after an intended change to the layout, regenerate it with
`LOCALRADIX_UPDATE_SNAPSHOTS=1 pytest tests/tui/test_tui_snapshot.py` and look at it in a
browser before committing. On a mismatch the new SVG is written next to the saved one
(`*.actual.svg`, not committed) and the failure shows the screen as text.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tui_fakes import T0, FixedProbe, RecordingApi, ScriptedFeed, advance, screen_text, snapshot

from localradix.tui.app import LocalRadixApp
from localradix.tui.feed import Connected, Snapshot

pytestmark = pytest.mark.asyncio

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("LOCALRADIX_UPDATE_SNAPSHOTS") == "1"


def recorded_feed() -> ScriptedFeed:
    """Thirty seconds of an agent-like workload: a warm cache, a burst of misses, recovery."""
    feed, snap = ScriptedFeed(), snapshot()
    feed.push(Connected(feed.url, "sse"))
    feed.push(Snapshot(snap))
    for second in range(30):
        miss = 900 if 10 <= second < 13 else 60
        snap = advance(snap, 1, hit=1000 if second % 7 else 0, miss=miss)
        snap["engine"]["prefill_tokens_per_s"] = 400.0 + 40 * (second % 9)
        snap["engine"]["decode_tokens_per_s"] = 20.0 + 3 * (second % 5)
        feed.push(Snapshot(snap))
    return feed


@pytest.mark.parametrize("size", [(80, 24)])
async def test_dashboard_svg_snapshot(size):
    app = LocalRadixApp(
        recorded_feed(), RecordingApi(), probe=FixedProbe(), clock=lambda: T0, render_interval=0
    )
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.2)
        await pilot.pause()
        svg, text = app.export_screenshot(), screen_text(app)
    saved = SNAPSHOTS / f"dashboard_{size[0]}x{size[1]}.svg"
    if UPDATE or not saved.exists():
        SNAPSHOTS.mkdir(exist_ok=True)
        saved.write_text(svg, encoding="utf-8")
        if not UPDATE:
            pytest.skip(f"wrote the first snapshot {saved.name}; check it and commit it")
    actual = saved.with_suffix(".actual.svg")
    if svg != saved.read_text(encoding="utf-8"):
        actual.write_text(svg, encoding="utf-8")
        pytest.fail(f"{saved.name} changed (new one: {actual.name}); the screen now:\n{text}")
    actual.unlink(missing_ok=True)
