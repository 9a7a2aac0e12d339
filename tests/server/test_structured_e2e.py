"""Structured output and tool calls end to end: `localradix serve` on the bundled
SmolLM2-135M-Instruct, driven by the real `openai` SDK (one server per module).

Every constrained output must parse and validate (jsonschema) every time; bad grammars are 400s
naming the parameter. The last test checks the streaming assembly on canned engine deltas.
"""

from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import jsonschema
import pytest

from localradix.server.core.output import ChatOutputSpec
from localradix.server.openai.chat import chat_stream
from localradix.server.tokenizer_manager import Delta

# Short strings and bounded numbers keep outputs well inside max_tokens (a small model may
# otherwise write digits until it runs out).
S = {"type": "string", "maxLength": 16}
INT = {"type": "integer", "minimum": 0, "maximum": 999}


def obj(required: list[str] | None = None, **props: object) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


SCHEMAS = [
    obj(name=S, age={"type": "integer", "minimum": 0, "maximum": 120}),
    obj(city=S, population={"type": "integer", "minimum": 1, "maximum": 10_000_000}),
    obj(color={"type": "string", "enum": ["red", "green", "blue"]}),
    obj(ok={"type": "boolean"}),
    obj(score={"type": "number", "minimum": 0, "maximum": 1}),
    obj(tags={"type": "array", "items": S, "minItems": 1, "maxItems": 3}),
    obj(point=obj(x=INT, y=INT)),
    obj(user=obj(name=S, address=obj(street=S, zip={"type": "string", "pattern": "^[0-9]{5}$"}))),
    obj(items={"type": "array", "items": obj(id=INT, label=S), "maxItems": 2}),
    obj(["title"], title=S, subtitle=S),
    obj(level={"type": "string", "enum": ["low", "medium", "high"]}, count=INT),
    obj(
        answer={"type": "string", "enum": ["yes", "no"]},
        confidence={"type": "number", "minimum": 0, "maximum": 1},
    ),
    obj(values={"type": "array", "items": INT, "maxItems": 4}),
    obj(
        book=obj(title=S, year={"type": "integer", "minimum": 1500, "maximum": 2025}),
        available={"type": "boolean"},
    ),
    obj(status={"enum": ["active", "inactive", None]}),
    obj(temperature={"type": "number", "exclusiveMinimum": -50, "exclusiveMaximum": 60}, unit=S),
    obj(first=S, last=S, middle={"type": ["string", "null"], "maxLength": 8}),
    obj(
        matrix={
            "type": "array",
            "items": {"type": "array", "items": INT, "maxItems": 2},
            "maxItems": 2,
        }
    ),
    obj(kind={"const": "event"}, day={"type": "integer", "minimum": 1, "maximum": 31}),
    obj(id=INT, meta=obj([], source=S, weight={"type": "number", "minimum": 0, "maximum": 100})),
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": obj(
            city={"type": "string", "maxLength": 24},
            unit={"type": "string", "enum": ["celsius", "fahrenheit"]},
        ),
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the local time in a timezone",
        "parameters": obj(timezone={"type": "string", "maxLength": 24}),
    },
}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def _schema_format(i: int, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}}


@pytest.mark.slow
def test_twenty_json_schemas_all_validate(client, model):
    def ask(i: int) -> tuple[str, str | None]:
        schema = SCHEMAS[i]
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Give an example object: {json.dumps(schema)}"}],
            response_format=_schema_format(i, schema),
            max_tokens=150,
            temperature=0,
        )
        return r.choices[0].message.content, r.choices[0].finish_reason

    assert len(SCHEMAS) == 20
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(len(SCHEMAS))))
    bad = [(s, t) for s, (t, f) in zip(SCHEMAS, results, strict=True) if f != "stop"]
    assert not bad, bad
    for schema, (text, _) in zip(SCHEMAS, results, strict=True):
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.slow
def test_json_object_parses(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        response_format={"type": "json_object"},
        max_tokens=150,
        temperature=0,
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_completions_json_schema_and_regex(client, model, stream):
    schema = SCHEMAS[0]
    kw = dict(model=model, max_tokens=60, temperature=0, stream=stream)
    r = client.completions.create(
        prompt="A person as JSON:", extra_body={"response_format": _schema_format(0, schema)}, **kw
    )
    text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
    jsonschema.validate(json.loads(text), schema)
    r = client.completions.create(
        prompt="The year of the moon landing was", extra_body={"regex": r"[12][0-9]{3}"}, **kw
    )
    text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
    assert re.fullmatch(r"[12][0-9]{3}", text), text


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_chat_regex_and_ebnf(client, model, stream):
    kw = dict(model=model, max_tokens=20, temperature=0, stream=stream)
    grammar = 'root ::= answer "." \nanswer ::= "yes" | "no" | "maybe"'
    for extra, pattern in [
        ({"regex": r"(red|green|blue) [0-9]{1,2}"}, r"(red|green|blue) [0-9]{1,2}"),
        ({"ebnf": grammar}, r"(yes|no|maybe)\."),
    ]:
        r = client.chat.completions.create(
            messages=[{"role": "user", "content": "Answer briefly: is the sky blue?"}],
            extra_body=extra,
            **kw,
        )
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in r if c.choices)
        else:
            text = r.choices[0].message.content
        assert re.fullmatch(pattern, text), (extra, text)


def _stream_calls(chunks) -> tuple[list[dict], str | None, str]:
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or ():
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                if d.id:
                    call["id"] = d.id
                if d.function and d.function.name:
                    call["name"] += d.function.name
                if d.function and d.function.arguments:
                    call["arguments"] += d.function.arguments
            finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, content


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_time"}}],
    ids=["required", "named"],
)
def test_forced_tool_calls_have_valid_arguments(client, model, stream, tool_choice):
    questions = [
        ASK_WEATHER,
        [{"role": "user", "content": "What time is it in Tokyo?"}],
    ]
    for messages in questions:
        r = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            max_tokens=100,
            temperature=0,
            stream=stream,
        )
        if stream:
            calls, finish, content = _stream_calls(r)
        else:
            message = r.choices[0].message
            calls = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in message.tool_calls or ()
            ]
            finish, content = r.choices[0].finish_reason, message.content
            assert content is None
        assert finish == "tool_calls"
        assert not (content or "").strip()
        assert len(calls) == 1, calls
        call = calls[0]
        assert call["id"].startswith("call_")
        if isinstance(tool_choice, dict):
            assert call["name"] == "get_time"
        jsonschema.validate(json.loads(call["arguments"]), PARAMS[call["name"]])


@pytest.mark.slow
def test_tool_results_go_back_through_the_template(client, model):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
    }
    messages = [
        *ASK_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    r = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=20, temperature=0
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, param, words",
    [
        (
            {
                "response_format": _schema_format(
                    0, {"type": "object", "properties": {"a": {"type": "nonsense"}}}
                )
            },
            "response_format",
            "nonsense",
        ),
        ({"ebnf": 'root ::= "a" | '}, "ebnf", "ebnf"),
        ({"regex": "(unclosed"}, "regex", "regex"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "xml"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "schema"),
        ({"regex": "a+", "ebnf": 'root ::= "a"'}, "ebnf", "at most one"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "nope",
        ),
        ({"tool_choice": "required"}, "tool_choice", "tool"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_invalid_constraints_are_400s_naming_the_problem(
    server, model, extra, param, words, stream
):
    body = {"model": model, "messages": ASK_WEATHER, "max_tokens": 5, "stream": stream, **extra}
    r = httpx.post(server.base + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert words in error["message"], error["message"]
    assert "[invalid constraint]" not in error["message"]


@pytest.mark.slow
def test_healthy_and_idle_after(server, client, model):
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    r = client.chat.completions.create(model=model, messages=ASK_WEATHER, max_tokens=5)
    assert r.choices[0].message.content
    stats = httpx.get(server.base + "/stats", timeout=10).json()
    assert stats["server"]["in_flight"] == 0


# ---- streaming assembly on canned deltas (no server) ------------------------------------------


class _FakeJob:
    def __init__(self, batches: list[list[Delta]], output: ChatOutputSpec) -> None:
        self.batches = batches
        self.output = output
        self.choices = [SimpleNamespace(index=0)]
        self.manager = SimpleNamespace()
        self.rid, self.created = "x", 0

    async def deltas(self):
        for batch in self.batches:
            yield batch

    def close(self) -> None:
        pass

    def usage(self) -> dict:
        return {}


def test_stream_assembly_of_reasoning_content_and_tool_calls():
    text = (
        "<think>let me check</think>Sure.<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    )
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    batches = [[Delta(0, p)] for p in pieces] + [[Delta(0, "", finish_reason="stop")]]
    spec = ChatOutputSpec("hermes", "qwen3", None, ("get_weather",))

    async def collect() -> list[dict]:
        out = []
        async for raw in chat_stream(_FakeJob(batches, spec), "m", False, False):
            line = raw.decode().removeprefix("data: ").strip()
            if line != "[DONE]":
                out.append(json.loads(line))
        return out

    chunks = asyncio.run(collect())
    deltas = [c["choices"][0]["delta"] for c in chunks]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    items = [t for d in deltas for t in d.get("tool_calls", ())]
    assert reasoning == "let me check"
    assert content == "Sure."
    assert items[0]["id"].startswith("call_") and items[0]["function"]["name"] == "get_weather"
    assert {t["index"] for t in items} == {0}
    arguments = "".join(t["function"]["arguments"] for t in items)
    assert json.loads(arguments) == {"city": "Paris", "unit": "celsius"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # the whole output parses the same way
    parsed = spec.parse(text)
    assert parsed.reasoning == "let me check" and parsed.content == "Sure."
    assert json.loads(parsed.calls[0].arguments) == {"city": "Paris", "unit": "celsius"}
