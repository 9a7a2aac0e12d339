"""Unit tests of the server's pieces that need no process: metrics text, error mapping (the
engine loop over ZMQ with a FAKE core is in test_engine_loop.py)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import msgspec
import pytest

from localradix.messages import EngineStats
from localradix.server.core.http import encode_json
from localradix.server.errors import from_decode_error
from localradix.server.metrics import Histogram, ServerMetrics
from localradix.server.protocol import ChatCompletionRequest
from localradix.server.state import ServerState

SAMPLE = re.compile(r'^[a-z_0-9]+(\{[a-z_]+="[^"]*"\})? -?[0-9.e+-]+$|^# (HELP|TYPE) ')


def test_histogram_buckets_are_cumulative():
    h = Histogram("x_seconds", "x", (0.1, 1.0))
    h.observe(0.05)
    h.observe(0.5, times=2)
    h.observe(5.0)
    lines = h.render()
    assert 'localradix_x_seconds_bucket{le="0.1"} 1' in lines
    assert 'localradix_x_seconds_bucket{le="1.0"} 3' in lines
    assert 'localradix_x_seconds_bucket{le="+Inf"} 4' in lines
    assert "localradix_x_seconds_count 4" in lines


def test_metrics_text_is_valid_exposition_format():
    m = ServerMetrics()
    m.record_finish("stop", prompt=10, generated=5, cached=8)
    m.record_error(400)
    m.ttft.observe(0.2)
    stats = EngineStats(
        running=2,
        queued=1,
        kv_total=100,
        kv_used=10,
        kv_cached=20,
        kv_free=70,
        cache_hit_tokens=8,
        cache_miss_tokens=2,
        spec_verify_steps=3,
        spec_draft_tokens=12,
        spec_accepted_tokens=9,
    )
    text = m.render(stats, in_flight=3, engine_alive=True)
    for line in text.strip().splitlines():
        assert SAMPLE.match(line), line
    assert "localradix_cache_hit_rate 0.8" in text
    assert 'localradix_kv_tokens{state="cached"} 20' in text
    assert 'localradix_requests_total{finish_reason="stop"} 1' in text
    assert 'localradix_http_errors_total{status="400"} 1' in text
    assert "localradix_spec_accepted_tokens_total 9" in text
    assert "localradix_spec_acceptance_rate 0.75" in text


# KVTiers.stats() with a host and a disk tier (localradix/mem/kv_tiers.py).
TIERS = {
    "demoted_tokens": 120_000,
    "promoted_tokens": 34_000,
    "disk_hit_tokens": 30_000,
    "promotions": 12,
    "skipped_tokens": 256,
    "load_seconds": 1.25,
    "host_bytes": 3 * 2**30,
    "host_tokens": 98_304,
    "disk_bytes": 1_288_490_188,
    "disk_dir": "/tmp/kv",
    "disk_budget": 16 * 2**30,
    "disk_files_written": 300,
    "disk_bytes_written": 2 * 2**30,
    "disk_corrupt": 2,
    "disk_dropped": 5,
}


def test_metrics_show_the_cache_tiers():
    text = ServerMetrics().render(EngineStats(kv_tiers=TIERS), in_flight=0, engine_alive=True)
    for line in text.strip().splitlines():
        assert SAMPLE.match(line), line
    lines = text.splitlines()
    for expected in [
        "# TYPE localradix_kv_tier_bytes gauge",
        'localradix_kv_tier_bytes{tier="host"} 3221225472',
        'localradix_kv_tier_bytes{tier="disk"} 1288490188',
        "# TYPE localradix_kv_tier_demoted_tokens_total counter",
        "localradix_kv_tier_demoted_tokens_total 120000",
        "localradix_kv_tier_promoted_tokens_total 34000",
        "localradix_kv_tier_disk_hit_tokens_total 30000",
        "localradix_kv_tier_promotions_total 12",
        "localradix_kv_tier_skipped_tokens_total 256",
        "# TYPE localradix_kv_tier_load_seconds_total counter",
        "localradix_kv_tier_load_seconds_total 1.25",
        "# TYPE localradix_kv_tier_disk_budget_bytes gauge",
        "localradix_kv_tier_disk_budget_bytes 17179869184",
        "localradix_kv_tier_disk_files_written_total 300",
        "localradix_kv_tier_disk_bytes_written_total 2147483648",
        "localradix_kv_tier_disk_corrupt_files_total 2",
        "localradix_kv_tier_disk_dropped_writes_total 5",
    ]:
        assert expected in lines, f"{expected!r} not in /metrics:\n{text}"
    assert "/tmp/kv" not in text
    names = [ln.split()[2] for ln in lines if ln.startswith("# TYPE")]
    assert len(names) == len(set(names)), "a metric family declared twice"


def test_metrics_show_only_the_tiers_that_are_on():
    host_only = {k: v for k, v in TIERS.items() if not k.startswith("disk")}
    text = ServerMetrics().render(EngineStats(kv_tiers=host_only), 0, True)
    assert 'localradix_kv_tier_bytes{tier="host"} 3221225472' in text
    assert "localradix_kv_tier_promotions_total 12" in text
    assert 'tier="disk"' not in text and "kv_tier_disk_" not in text
    for tiers in ({}, None):
        stats = EngineStats() if tiers is None else EngineStats(kv_tiers=tiers)
        assert "kv_tier" not in ServerMetrics().render(stats, 0, True)
    assert "kv_tier" not in ServerMetrics().render(None, 0, False)


def _payload(stats: EngineStats | None, previews: bool) -> dict:
    """/v1/stats as the route encodes it, from a server with nothing but the fields it reads."""
    server = SimpleNamespace(
        client=SimpleNamespace(stats=stats, info={}, alive=True, pid=1),
        pool=SimpleNamespace(describe=list),
        metrics=ServerMetrics(),
        started=0.0,
        draining=False,
        manager=None,
    )
    return msgspec.json.decode(encode_json(ServerState.stats_payload(server, previews)))


@pytest.mark.parametrize("previews", [True, False])
def test_stats_json_carries_the_cache_tiers(previews):
    assert _payload(EngineStats(kv_tiers=TIERS), previews)["engine"]["kv_tiers"] == TIERS
    assert _payload(EngineStats(), previews)["engine"]["kv_tiers"] == {}
    assert _payload(None, previews)["engine"] is None


@pytest.mark.parametrize(
    "body,param",
    [
        (b'{"messages": [{"role": 3}]}', "messages[0].role"),
        (b'{"messages": [{"role": "user"}], "n": "2"}', "n"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": [{"role": "user"}], "top_p": 2}', "top_p"),
        (b"{", None),
    ],
)
def test_decode_errors_name_the_parameter(body, param):
    with pytest.raises(msgspec.MsgspecError) as info:
        msgspec.json.decode(body, type=ChatCompletionRequest, strict=True)
    err = from_decode_error(info.value)
    assert err.status == 400 and err.param == param and err.message
