"""The TUI's pure parts: formatting, tolerant parsing, hit-rate deltas, sparklines, CLI glue."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys

import pytest
from tui_fakes import T0, advance, snapshot

from localradix.tui import add_tui_parser, add_up_parser, fmt
from localradix.tui.api import ApiError, ChatDelta, ChatUsage, chat_events, error_message
from localradix.tui.feed import parse_sse_line
from localradix.tui.spark import bar_cells, spark_rows
from localradix.tui.stats import Stats
from localradix.tui.system import SystemSample, is_local, merge
from localradix.tui.tables import short_id, tokens_per_s
from localradix.tui.trends import Trends


@pytest.mark.parametrize("bad", [None, "12", True, math.nan, math.inf, [], {}])
def test_formatters_render_unknown_values_as_a_dash(bad):
    for f in (fmt.count, fmt.rate, fmt.pct, fmt.seconds, fmt.uptime, fmt.gib):
        assert f(bad) == fmt.DASH


def test_formatters():
    assert [fmt.count(v) for v in (0, 987, 4096, 32768, 1.5e6, 2e9)] == [
        "0", "987", "4096", "32.8k", "1.5M", "2G"
    ]  # fmt: skip
    assert fmt.rate(1234.0) == "1234/s"
    assert fmt.pct(0.904) == "90%"
    assert [fmt.seconds(v) for v in (0.085, 1.234, 123)] == ["85ms", "1.23s", "2m03s"]
    assert fmt.uptime(754) == "0:12:34"
    assert fmt.uptime(3 * 86400 + 7200) == "3d 2h"
    assert fmt.gib(3.5 * 2**30) == "3.5G"
    assert fmt.text("a\nb  c", 4) == "a b…"
    assert fmt.text(None) == fmt.DASH


@pytest.mark.parametrize(
    "data",
    [None, [], "garbage", {"engine": "x"}, {"engine": None, "model": 3},
     {"engine": {"requests": "nope", "top_prefixes": [1, None, {"tokens": "many"}]}}],
)  # fmt: skip
def test_stats_parse_tolerates_anything(data):
    stats = Stats.parse(data)
    assert stats.get("running") is None
    assert stats.hit_rate_total is None
    assert not stats.busy
    assert all(isinstance(r, dict) for r in stats.top_prefixes)


def test_stats_parse_reads_the_snapshot():
    stats = Stats.parse(snapshot())
    assert stats.get("kv_used") == 4096
    assert stats.hit_rate_total == pytest.approx(0.9)
    assert stats.busy
    assert stats.model["name"] == "SmolLM2-135M-Instruct"
    assert len(stats.requests) == 2 and stats.requests[0]["state"] == "decode"


def test_hit_rate_now_comes_from_deltas_between_snapshots():
    trends, snap = Trends(window_s=5), snapshot()
    trends.add(Stats.parse(snap), T0)
    assert trends.hit_rate_now is None  # one snapshot: no delta yet
    for _ in range(3):
        snap = advance(snap, 1, hit=100, miss=300)
        trends.add(Stats.parse(snap), 0)
    assert trends.hit_rate_now == pytest.approx(0.25)  # not the lifetime 9000/10000
    for _ in range(6):  # the window slides past the old traffic
        snap = advance(snap, 1, hit=90, miss=10)
        trends.add(Stats.parse(snap), 0)
    assert trends.hit_rate_now == pytest.approx(0.9)
    for _ in range(6):
        snap = advance(snap, 1, hit=0, miss=0)
        trends.add(Stats.parse(snap), 0)
    assert trends.hit_rate_now is None  # idle
    series = trends.hit_series()
    assert series[0] is None and series[1] == pytest.approx(0.25) and series[-1] is None


def test_trends_fill_gaps_and_restart_when_counters_go_back():
    trends, snap = Trends(), snapshot()
    trends.add(Stats.parse(snap), 0)
    later = advance(snap, 10, hit=10, miss=10)
    trends.add(Stats.parse(later), 0)
    assert len(trends.hit_series()) == 11  # one column per second, gap included
    restarted = advance(later, 1, hit=-9000, miss=-1000)
    trends.add(Stats.parse(restarted), 0)
    assert trends.restarts == 1 and len(trends.hit_series()) == 1


def test_trends_use_the_clock_when_snapshots_have_no_time():
    trends, snap = Trends(), snapshot()
    del snap["time"]
    trends.add(Stats.parse(snap), 100.0)
    trends.add(Stats.parse(advance({**snap, "time": 0}, 0, 50, 50) | {"time": None}), 101.0)
    assert trends.hit_rate_now == pytest.approx(0.5)


def test_spark_rows_keep_a_fixed_scale_and_show_gaps():
    assert spark_rows([0.0, 0.5, 1.0, None], 6, top=1.0) == ["  ▁▄█ "]
    two = spark_rows([1.0, 0.25], 2, height=2, top=1.0)
    assert two == ["█ ", "█▄"]
    assert spark_rows([], 3) == ["   "]
    assert spark_rows([5, 10], 2) == ["▄█"]  # default scale: the maximum


def test_bar_cells_split_the_width_and_keep_slivers():
    assert sum(bar_cells([4096, 32768, 94208], 22)) == 22
    assert bar_cells([1, 0, 1000], 10)[0] == 1
    assert bar_cells([None, None], 5) == [0, 0]


def test_request_helpers():
    assert short_id("chatcmpl-abcdef0123456") == "def0123456"
    assert short_id("e01a7c76a-7") == "01a7c76a-7"
    assert short_id(None) == fmt.DASH
    assert tokens_per_s({"generated_tokens": 21, "age_s": 1.25, "ttft_s": 0.25}) == 20
    assert tokens_per_s({"generated_tokens": 1, "age_s": 9, "ttft_s": 9}) is None
    assert tokens_per_s({"generated_tokens": 0, "age_s": 1, "ttft_s": None}) is None
    assert tokens_per_s({"tokens_per_s": 33.0}) == 33.0


def test_sse_and_chat_parsing():
    assert parse_sse_line('data: {"a": 1}') == {"a": 1}
    assert parse_sse_line(": keepalive") is None
    assert parse_sse_line("data: {broken") is None
    assert parse_sse_line("data: [DONE]") is None
    usage = {"prompt_tokens": 9, "completion_tokens": 2,
             "prompt_tokens_details": {"cached_tokens": 8}}  # fmt: skip
    line = "data: " + __import__("json").dumps(
        {"choices": [{"delta": {"content": "hi"}}], "usage": usage}
    )
    assert chat_events(line) == [ChatDelta("hi"), ChatUsage(9, 8, 2)]
    with pytest.raises(ApiError, match="boom"):
        chat_events('data: {"error": {"message": "boom"}}')


def test_error_message_reads_openai_errors():
    assert error_message(b'{"error": {"message": "busy"}}') == "busy"
    assert error_message(b"<html>\nBad Gateway") == "<html>"
    assert error_message(b"") == "(empty response)"


def test_system_merge_prefers_the_servers_figures():
    local = SystemSample(cpu_percent=10, ram_used=1, ram_total=2)
    merged = merge({"cpu_percent": 55, "device_mem_used": 5, "device_mem_total": 8}, local)
    assert (merged.cpu_percent, merged.ram_total, merged.device_total) == (55, 2, 8)
    assert merge({}, local) is local
    assert is_local("http://127.0.0.1:8000") and not is_local("http://gpu-box:8000")


def test_parsers():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_tui_parser(sub)
    add_up_parser(sub)
    ns = parser.parse_args(["tui", "--url", "http://h:1", "--api-key", "k"])
    assert (ns.url, ns.api_key, ns.func.__name__) == ("http://h:1", "k", "run_tui")
    ns = parser.parse_args(["up", "--model", "m.gguf", "--mem-fraction", "0.5", "--theme",
                            "textual-light"])  # fmt: skip
    assert ns.func.__name__ == "run_default"

    from localradix.child_server import serve_argv

    argv = serve_argv(ns, 4321)
    assert argv[1:6] == ["-m", "localradix", "serve", "m.gguf", "--host"]
    assert argv[argv.index("--port") + 1] == "4321"
    assert argv[argv.index("--mem-fraction") + 1] == "0.5"
    assert "--theme" not in argv and "--api-key" not in argv


def test_the_tui_never_imports_torch():
    code = (
        "import sys, localradix.tui, localradix.tui.app, localradix.tui.main;"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "torch" not in out.stdout


def test_status_line_shows_speculation_only_once_drafting():
    from localradix.tui.panels import StatusLine, View

    plain = Stats.parse(snapshot())
    line = StatusLine().lines(View(stats=plain), 200)[0]
    assert "spec" not in line
    snap = snapshot()
    snap["engine"].update(spec_verify_steps=10, spec_draft_tokens=40, spec_accepted_tokens=30)
    line = StatusLine().lines(View(stats=Stats.parse(snap)), 200)[0]
    assert "spec accept [b]75%[/] 4.0 tok/step" in line


def test_status_line_shows_the_models_once_several_or_one_is_loading():
    from localradix.tui.panels import StatusLine, View

    snap = snapshot()
    snap["models"] = [{"name": "smollm2", "state": "ready"}]
    assert "models" not in StatusLine().lines(View(stats=Stats.parse(snap)), 200)[0]
    snap["models"].append({"name": "qwen:7b", "state": "loading"})
    line = StatusLine().lines(View(stats=Stats.parse(snap)), 200)[0]
    assert "models [b]2[/] smollm2, [$text-warning]qwen:7b loading[/]" in line
    snap["models"] = [{"name": "smollm2", "state": "ready"}]
    snap["models"].append({"name": "coder", "state": "failed"})
    line = StatusLine().lines(View(stats=Stats.parse(snap)), 200)[0]
    assert "[$text-error]coder failed[/]" in line


def test_kv_panel_shows_weights_and_kv_memory_apart():
    from localradix.tui.panels import memory_split

    model = {"weight_bytes": 110 * 2**20, "kv_bytes": 3 * 2**30}
    assert memory_split(model) == "weights 110M · KV 3.0G"
    assert memory_split({"weight_bytes": 513 * 2**20}) == "weights 513M · KV –"
    assert memory_split({}) == ""  # an older server: nothing, not two dashes
    assert memory_split({"weight_bytes": "lots", "kv_bytes": None}) == ""


TIERS = {
    "demoted_tokens": 120_000,
    "promoted_tokens": 34_200,
    "disk_hit_tokens": 30_000,
    "promotions": 12,
    "skipped_tokens": 0,
    "load_seconds": 1.3,
    "host_bytes": 3 * 2**30,
    "host_tokens": 98_304,
    "disk_bytes": int(1.2 * 2**30),
    "disk_dir": "/home/u/.cache/localradix/kv",
    "disk_budget": 16 * 2**30,
    "disk_files_written": 300,
    "disk_bytes_written": 2 * 2**30,
    "disk_corrupt": 0,
    "disk_dropped": 0,
}


def test_status_line_has_a_second_line_for_the_cache_tiers():
    from localradix.tui.panels import StatusLine, View

    assert len(StatusLine().lines(View(stats=Stats.parse(snapshot())), 200)) == 1
    assert len(StatusLine().lines(View(stats=Stats.parse(snapshot(kv_tiers={}))), 200)) == 1
    lines = StatusLine().lines(View(stats=Stats.parse(snapshot(kv_tiers=TIERS))), 200)
    assert lines[1] == (
        "[dim]KV tiers[/] host [b]3.0G[/] · disk [b]1.2G[/] of 16.0G"
        " · [b]34.2k[/] tokens loaded back (12 requests) · 1.30s loading"
    )
    disk_only = {k: v for k, v in TIERS.items() if not k.startswith("host")}
    disk_only.update(disk_corrupt=2, disk_dropped=5)
    line = StatusLine().lines(View(stats=Stats.parse(snapshot(kv_tiers=disk_only))), 200)[1]
    assert "host" not in line and "disk [b]1.2G[/] of 16.0G" in line
    assert "[$text-warning]corrupt files 2[/] · [$text-warning]writes dropped 5[/]" in line
    host_only = {k: v for k, v in TIERS.items() if not k.startswith("disk")}
    line = StatusLine().lines(View(stats=Stats.parse(snapshot(kv_tiers=host_only))), 200)[1]
    assert "disk" not in line and "host [b]3.0G[/]" in line
    narrow = StatusLine().lines(View(stats=Stats.parse(snapshot(kv_tiers=TIERS))), 60)[1]
    assert narrow == "[dim]KV tiers[/] host [b]3.0G[/] · disk [b]1.2G[/] of 16.0G"


@pytest.mark.parametrize("tiers", [None, "on", [1, 2], {"disk_bytes": "lots"}])
def test_stats_parse_tolerates_odd_cache_tiers(tiers):
    from localradix.tui.panels import StatusLine, View

    stats = Stats.parse(snapshot(kv_tiers=tiers))
    assert stats.tier("disk_bytes") is None
    lines = StatusLine().lines(View(stats=stats), 200)
    assert len(lines) == (2 if stats.kv_tiers else 1)
    assert all("None" not in line for line in lines)
