"""On the bundled model (one real server per module): forced tool calls cut by max_tokens are
never content or half calls, streamed or not; a grammar slow to compile delays no other request
and past --grammar-compile-timeout is a 400."""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from server_harness import start_server

pytestmark = pytest.mark.slow

COMPILE_TIMEOUT_S = 5
CITY = {"type": "string", "maxLength": 24}
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": CITY, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}}]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
# xgrammar expands this pattern into a huge automaton: tens of seconds on a 2-core CPU.
SLOW_SCHEMA = {"type": "string", "pattern": "^([a-z]{1,30}){1,30}$"}


@pytest.fixture(scope="module")
def server():
    args = ["--backend", "cpu", "--max-total-tokens", "8192", "--max-running-requests", "8"]
    args += ["--tool-call-parser", "hermes"]  # the cut-offs below are of hermes' format
    s = start_server([*args, "--grammar-compile-timeout", str(COMPILE_TIMEOUT_S)], fake=False)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def chat(server, body: dict, timeout: float = 300) -> httpx.Response:
    return httpx.post(server.base + "/chat/completions", json=body, timeout=timeout)


def streamed(server, body: dict) -> tuple[list[dict], str, str | None]:
    """(tool calls as sent, content, finish_reason) of a streamed chat completion."""
    calls: list[dict] = []
    content, finish = "", None
    with httpx.stream("POST", server.base + "/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                content += choice["delta"].get("content") or ""
                for item in choice["delta"].get("tool_calls") or ():
                    assert item.get("id"), "a call arrives whole, in one delta"
                    calls.append(item["function"])
                finish = choice["finish_reason"] or finish
    return calls, content, finish


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("max_tokens", [20, 100])
def test_forced_calls_cut_by_max_tokens_are_dropped(server, stream, max_tokens):
    """SmolLM2 keeps calling with parallel_tool_calls: 20 tokens cut the first call, 70 the
    second (the first takes about 70). What is left is complete calls only."""
    body = {
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        calls, content, finish = streamed(server, body)
    else:
        r = chat(server, body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        calls = [c["function"] for c in choice["message"].get("tool_calls") or ()]
        content, finish = choice["message"]["content"] or "", choice["finish_reason"]
    assert finish == "length"
    assert content == "", content  # no <tool_call> markup, no half call as text
    assert len(calls) == (0 if max_tokens == 20 else 1)
    for call in calls:
        assert call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER_PARAMS)


def test_a_slow_grammar_delays_no_one_and_times_out_as_a_400(server):
    slow_body = {
        "messages": ASK,
        "max_tokens": 8,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "slow", "schema": SLOW_SCHEMA},
        },
    }
    fresh = {"type": "object", "properties": {uuid.uuid4().hex[:8]: CITY}}  # never compiled yet
    quick = [
        {"messages": ASK, "max_tokens": 4},
        {
            "messages": ASK,
            "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"schema": fresh}},
        },
    ]
    assert chat(server, {**quick[0], "response_format": {"type": "json_object"}}).status_code == 200
    done: dict[str, float] = {}

    def timed(name: str, body: dict) -> httpx.Response:
        r = chat(server, body)
        done[name] = time.monotonic()
        return r

    with ThreadPoolExecutor(3) as pool:
        t0 = time.monotonic()
        slow = pool.submit(timed, "slow", slow_body)
        time.sleep(0.5)  # the slow grammar is compiling
        others = [pool.submit(timed, f"quick{i}", body) for i, body in enumerate(quick)]
        for future in others:
            assert future.result().status_code == 200, future.result().text
        r = slow.result()
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format" and error["code"] == "invalid_grammar"
    assert f"longer than {COMPILE_TIMEOUT_S} s" in error["message"]
    assert done["slow"] - t0 >= COMPILE_TIMEOUT_S - 0.5
    assert max(done["quick0"], done["quick1"]) < done["slow"]  # finished while it compiled
    t1 = time.monotonic()
    assert chat(server, slow_body, timeout=30).status_code == 400  # refused again, from cache
    assert time.monotonic() - t1 < COMPILE_TIMEOUT_S
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
