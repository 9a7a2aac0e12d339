"""Anthropic's Messages API end to end: `localradix serve` on the bundled SmolLM2-135M-Instruct,
driven by the real `anthropic` SDK (and httpx for the raw SSE event order). One server per module.

The SDK no longer takes sampling arguments, so `temperature` goes in `extra_body` (agents that
still send it are served).
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"name": "get_weather", "description": "Current weather in a city", "input_schema": CITY}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HELLO = [{"role": "user", "content": "Say hi."}]
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


@pytest.fixture(scope="module")
def ac(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def name(server):
    return httpx.get(server.base + "/models").json()["data"][0]["id"]


def sse_events(server, body: dict) -> list[tuple[str, dict]]:
    """(event, data) pairs of a raw streamed /v1/messages?beta=true, as Claude Code sends it."""
    headers = {"x-api-key": "unused", "anthropic-version": "2023-06-01"}
    url = server.url + "/v1/messages?beta=true"
    with httpx.stream(
        "POST", url, json={**body, "stream": True}, headers=headers, timeout=300
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events, kind = [], None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                assert data["type"] == kind
                events.append((kind, data))
    return events


def test_message_and_its_usage(ac, name):
    m = ac.messages.create(model=name, max_tokens=4, messages=HELLO, extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.model == name
    assert m.id.startswith("msg_")
    [block] = m.content
    assert block.type == "text" and block.text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert 0 < m.usage.output_tokens <= 4
    counted = ac.messages.count_tokens(model=name, messages=HELLO).input_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == counted > 5
    assert m.usage.cache_creation_input_tokens == 0

    system = [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": " Reply in English."},
    ]
    with_system = ac.messages.count_tokens(model=name, system=system, messages=HELLO).input_tokens
    as_string = ac.messages.count_tokens(
        model=name, system="You are terse. Reply in English.", messages=HELLO
    ).input_tokens
    assert with_system == as_string != counted


def test_stream_events_come_in_anthropics_order(server, ac, name):
    body = {"model": name, "max_tokens": 5, "messages": HELLO, **GREEDY}
    events = sse_events(server, body)
    kinds = [k for k, _ in events]
    assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    deltas = [d["delta"] for k, d in events if k == "content_block_delta"]
    assert all(d["type"] == "text_delta" for d in deltas)
    text = "".join(d["text"] for d in deltas)
    final = events[-2][1]
    assert final["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert final["usage"]["output_tokens"] == 5 or final["delta"]["stop_reason"] == "end_turn"

    # The SDK assembles the same message the non-streamed call returns (greedy).
    whole = ac.messages.create(model=name, max_tokens=5, messages=HELLO, extra_body=GREEDY)
    with ac.messages.stream(model=name, max_tokens=5, messages=HELLO, extra_body=GREEDY) as s:
        streamed = s.get_final_message()
    assert streamed.content[0].text == whole.content[0].text == text
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    assert streamed.stop_reason == whole.stop_reason


def test_stop_sequences_end_the_message_and_are_reported(ac, name):
    free = ac.messages.create(model=name, max_tokens=8, messages=HELLO, extra_body=GREEDY)
    words = free.content[0].text.split()
    assert len(words) >= 3, free.content[0].text
    stop = words[2]
    m = ac.messages.create(
        model=name, max_tokens=8, messages=HELLO, stop_sequences=[stop], extra_body=GREEDY
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert stop not in m.content[0].text
    assert free.content[0].text.startswith(m.content[0].text)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip(server, ac, name, stream):
    choice = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    kw = dict(model=name, max_tokens=100, messages=ASK, tools=TOOLS, tool_choice=choice)
    if stream:
        events = sse_events(server, {**kw, **GREEDY})
        starts = [d["content_block"] for k, d in events if k == "content_block_start"]
        assert starts[0]["type"] == "tool_use" and starts[0]["name"] == "get_weather"
        assert starts[0]["input"] == {}
        parts = [d["delta"] for k, d in events if k == "content_block_delta"]
        assert {p["type"] for p in parts} == {"input_json_delta"}
        jsonschema.validate(json.loads("".join(p["partial_json"] for p in parts)), CITY)
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
        with ac.messages.stream(**kw, extra_body=GREEDY) as s:
            m = s.get_final_message()
    else:
        m = ac.messages.create(**kw, extra_body=GREEDY)
    assert m.stop_reason == "tool_use"
    [use] = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id
    jsonschema.validate(use.input, CITY)

    follow = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "21 C and sunny"},
                {"type": "text", "text": "Summarise."},
            ],
        },
    ]
    r = ac.messages.create(
        model=name, max_tokens=4, messages=follow, tools=TOOLS, extra_body=GREEDY
    )
    assert r.content and r.usage.input_tokens + r.usage.cache_read_input_tokens > 40


def test_structured_output_config(ac, name):
    m = ac.messages.create(
        model=name,
        max_tokens=40,
        messages=[{"role": "user", "content": "Which city is the capital of France?"}],
        output_config={"format": {"type": "json_schema", "schema": CITY}},
        extra_body=GREEDY,
    )
    jsonschema.validate(json.loads(m.content[0].text), CITY)


def test_repeated_long_prompt_reads_the_radix_cache(ac, name):
    long_system = " ".join(f"Rule {i}: answer politely and briefly." for i in range(80))
    first = ac.messages.create(
        model=name, max_tokens=1, system=long_system, messages=HELLO, extra_body=GREEDY
    )
    second = ac.messages.create(
        model=name, max_tokens=1, system=long_system, messages=HELLO, extra_body=GREEDY
    )
    total = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert total > 500
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == total
    assert second.usage.cache_read_input_tokens >= total - 16  # all but the last page or so
    assert second.usage.cache_read_input_tokens > first.usage.cache_read_input_tokens


def test_bad_input_gets_anthropic_shaped_4xx_and_the_server_stays_healthy(server, name):
    ok = {"model": name, "max_tokens": 4, "messages": HELLO}
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "aGk="},
    }
    server_tool = {"type": "web_search_20250305", "name": "web_search"}
    # (body, status, whether count_tokens refuses it too: sampling fields are not its business)
    cases = [
        (b"{", 400, True),
        (b"[]", 400, True),
        ({"model": name, "messages": HELLO}, 400, False),  # no max_tokens
        ({**ok, "max_tokens": 0}, 400, False),
        ({**ok, "max_tokens": "4"}, 400, False),
        ({**ok, "model": "claude-sonnet-4-5"}, 404, True),
        ({**ok, "messages": []}, 400, True),
        ({**ok, "messages": [{"role": "system", "content": "x"}]}, 400, True),
        ({**ok, "messages": [{"role": "user", "content": [image]}]}, 400, True),
        ({**ok, "messages": [{"role": "user", "content": "hello " * 9000}]}, 400, False),
        ({**ok, "temperature": 250}, 400, False),
        ({**ok, "top_p": 3}, 400, False),
        ({**ok, "stop_sequences": [""]}, 400, False),
        ({**ok, "tools": TOOLS, "tool_choice": {"type": "sometimes"}}, 400, True),
        ({**ok, "tools": [server_tool]}, 400, True),
    ]
    headers = {"content-type": "application/json", "x-api-key": "unused"}
    for body, status, counted in cases:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        paths = ["/v1/messages"] + (["/v1/messages/count_tokens"] if counted else [])
        for path in paths:
            r = httpx.post(server.url + path, content=raw, headers=headers, timeout=60)
            assert r.status_code == status, (path, raw[:100], r.text)
            data = r.json()
            assert set(data) == {"type", "error"} and data["type"] == "error", data
            assert data["error"]["type"] == ERROR_TYPES[status]
            assert isinstance(data["error"]["message"], str) and data["error"]["message"]
    message = httpx.post(server.url + "/v1/messages", json={**ok, "stop_sequences": [""]}).json()
    assert "stop_sequences" in message["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def _idle(server) -> bool:
    stats = httpx.get(server.base + "/stats").json()
    return stats["server"]["in_flight"] == 0 and stats["engine"]["running"] == 0


def _finished(server) -> int:
    """Requests that ran to their end (an aborted one is not counted)."""
    return httpx.get(server.base + "/stats").json()["server"]["requests_total"]


def test_a_client_that_leaves_aborts_its_job(fake_server):
    """On the fake engine: a dropped SSE stream or a non-streamed request whose client times
    out frees its engine request."""
    from server_harness import wait_until

    finished = _finished(fake_server)
    body = {"model": "fake-model", "max_tokens": 100000, "messages": HELLO}
    with httpx.stream("POST", fake_server.url + "/v1/messages", json={**body, "stream": True}) as r:
        lines = r.iter_lines()  # kept: a dropped iterator closes the connection
        assert next(lines) == "event: message_start"
        assert wait_until(lambda: not _idle(fake_server))
    assert wait_until(lambda: _idle(fake_server))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(fake_server.url + "/v1/messages", json=body, timeout=0.5)
    assert wait_until(lambda: _idle(fake_server))
    assert _finished(fake_server) == finished  # both were aborted, not run to the end
