"""Tools reach the bundled SmolLM2-135M-Instruct, whose chat template has no tools section: the
server writes them into the prompt (every dialect counts them), forces calls in the generic
format and reads them back, and Ollama lists the `tools` capability. One real server per module
(`--tool-call-parser auto`, the default)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

jsonschema = pytest.importorskip("jsonschema")

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 20}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Time now", "parameters": TIME_PARAMS},
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
GREEDY = {"temperature": 0}


def prompt_tokens(client: Any, model: str, **kw: Any) -> int:
    r = client.chat.completions.create(model=model, messages=ASK, max_tokens=1, **kw)
    return int(r.usage.prompt_tokens)


def count_tokens(server: Any, model: str, **kw: Any) -> int:
    body = {"model": model, "messages": ASK, **kw}
    r = httpx.post(server.base + "/messages/count_tokens", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return int(r.json()["input_tokens"])


def test_tools_are_counted_in_every_dialect(server, client, model):
    plain = prompt_tokens(client, model)
    with_tools = prompt_tokens(client, model, tools=TOOLS)
    assert with_tools > plain + 100  # two schemas and the reply format
    # tool_choice "none" keeps the prompt (and so its cached prefix); only parsing is off.
    assert prompt_tokens(client, model, tools=TOOLS, tool_choice="none") == with_tools

    anthropic_tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]
    counted = count_tokens(server, model, tools=anthropic_tools)
    assert counted > count_tokens(server, model) + 100
    assert counted == with_tools  # the very prompt a message would send

    responses_tools = [{"type": "function", **t["function"]} for t in TOOLS]
    r = client.responses.create(model=model, input=ASK[0]["content"], max_output_tokens=16,
                                tools=responses_tools, **GREEDY)  # fmt: skip
    assert r.usage.input_tokens == with_tools

    # Ollama counts the prompt tokens the cache did not serve: a tool never sent before heads
    # the section, so only its first line can be cached.
    fresh = {"type": "function", "function": {"name": f"tool_{uuid.uuid4().hex}"}}
    ollama = {"model": model, "messages": ASK, "stream": False, "options": {"num_predict": 1}}
    bare = httpx.post(server.url + "/api/chat", json=ollama, timeout=120).json()
    tooled = {**ollama, "tools": [fresh, *TOOLS]}
    evaluated = httpx.post(server.url + "/api/chat", json=tooled, timeout=120).json()
    assert evaluated["prompt_eval_count"] > bare["prompt_eval_count"] + 100


def check_calls(calls: list[Any], names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_forced_calls_are_parsed_tool_calls(client, model, choice, stream):
    tool_choice: Any = choice
    if choice != "required":
        tool_choice = {"type": "function", "function": {"name": choice}}
    kw = dict(model=model, messages=ASK, tools=TOOLS, tool_choice=tool_choice, max_tokens=120)
    names = set(SCHEMAS) if choice == "required" else {choice}
    if not stream:
        r = client.chat.completions.create(**kw, **GREEDY)
        message = r.choices[0].message
        check_calls(message.tool_calls or [], names)
        assert not message.content and r.choices[0].finish_reason == "tool_calls"
        return
    calls, content = [], ""
    for chunk in client.chat.completions.create(**kw, **GREEDY, stream=True):
        for part in chunk.choices:
            content += part.delta.content or ""
            calls += part.delta.tool_calls or []  # each call arrives whole, in one delta
    check_calls(calls, names)
    assert not content


def test_a_tool_round_renders_and_answers(client, model):
    first = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, **GREEDY
    )
    [call, *_] = first.choices[0].message.tool_calls
    follow = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    r = client.chat.completions.create(
        model=model, messages=follow, tools=TOOLS, max_tokens=8, **GREEDY
    )
    assert r.usage.prompt_tokens > first.usage.prompt_tokens + 20  # the call and its result


def test_ollama_show_lists_tools(server, model):
    show = httpx.post(server.url + "/api/show", json={"model": model}, timeout=60).json()
    assert "tools" in show["capabilities"]
