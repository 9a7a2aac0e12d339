"""Unit tests of the server's pieces that need no process: metrics text, error mapping (the
engine loop over ZMQ with a FAKE core is in test_engine_loop.py)."""

from __future__ import annotations

import re

import msgspec
import pytest

from localradix.messages import EngineStats
from localradix.server.errors import from_decode_error
from localradix.server.metrics import Histogram, ServerMetrics
from localradix.server.protocol import ChatCompletionRequest

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
