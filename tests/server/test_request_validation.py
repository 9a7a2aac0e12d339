"""Request validation against a FAKE-engine server (one per module): the --default-max-tokens
cap, chat roles, and the published OpenAPI schema agreeing with what the server accepts."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_harness import start_server

from localradix.server.core.sampling import max_tokens_or_default

DEFAULT_CAP = 7
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def fake():
    s = start_server(["--default-max-tokens", str(DEFAULT_CAP)], fake=True)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def post(server: Any, route: str, body: Any, timeout: float = 10) -> httpx.Response:
    return httpx.post(server.base + route, json=body, timeout=timeout)


def sse_choices(server: Any, route: str, body: dict) -> list[dict]:
    choices = []
    with httpx.stream("POST", server.base + route, json=body, timeout=10) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choices.extend(json.loads(line[6:])["choices"])
    return choices


# ---- --default-max-tokens ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "route, body", [("/chat/completions", {"messages": USER}), ("/completions", {"prompt": "hi"})]
)
@pytest.mark.parametrize("stream", [False, True])
def test_omitted_max_tokens_is_capped_by_the_default(fake, route, body, stream):
    body = {**body, "stream": stream, "stream_options": {"include_usage": True}}
    if stream:
        choices = sse_choices(fake, route, body)
        finish = [c["finish_reason"] for c in choices if c.get("finish_reason")]
        text = "".join(
            c.get("text") or (c.get("delta") or {}).get("content") or "" for c in choices
        )
        assert finish == ["length"]
        assert len(text.encode()) == DEFAULT_CAP  # the fake tokenizer: one token per byte
    else:
        r = post(fake, route, body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == DEFAULT_CAP
        assert r.json()["choices"][0]["finish_reason"] == "length"
    explicit = post(fake, route, {**body, "stream": False, "max_tokens": 3}).json()
    assert explicit["usage"]["completion_tokens"] == 3
    # null means "not given", as in OpenAI's SDKs
    assert (
        post(fake, route, {**body, "stream": False, "max_tokens": None}).json()["usage"][
            "completion_tokens"
        ]
        == DEFAULT_CAP
    )


def test_default_zero_means_no_cap():
    def manager(default: int) -> Any:
        return SimpleNamespace(args=SimpleNamespace(default_max_tokens=default))

    assert max_tokens_or_default(manager(1024), None) == 1024
    assert max_tokens_or_default(manager(1024), 5000) == 5000  # an explicit value wins
    assert max_tokens_or_default(manager(0), None) is None  # None: up to the context length


# ---- roles ------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["wizard", "", "User", "function"])
def test_unknown_roles_are_a_quick_400_naming_the_field(fake, role):
    t0 = time.monotonic()
    body = {"messages": [{"role": "system", "content": "x"}, {"role": role, "content": "hi"}]}
    r = post(fake, "/chat/completions", body, timeout=5)  # no max_tokens: must not run at all
    assert time.monotonic() - t0 < 5
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[1].role" and error["type"] == "invalid_request_error"
    assert repr(role) in error["message"]


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant", "tool"])
def test_every_documented_role_is_accepted(fake, role):
    body = {"messages": [*USER, {"role": role, "content": "x"}], "max_tokens": 2}
    assert post(fake, "/chat/completions", body).status_code == 200


# ---- the published schema agrees with the validation ------------------------------------------


@pytest.fixture(scope="module")
def openapi(fake) -> dict:
    return httpx.get(fake.url + "/schema/openapi.json", timeout=10).json()


def validator(openapi: dict, name: str) -> jsonschema.protocols.Validator:
    schema = {"$ref": f"#/components/schemas/{name}", "components": openapi["components"]}
    return jsonschema.Draft202012Validator(schema)


CHAT = "ChatCompletionRequest"
COMPLETION = "CompletionRequest"
# Bodies both the schema and the server refuse (the server with a 400 naming the field).
INVALID: list[tuple[str, dict]] = [
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}),
    (CHAT, {"messages": [{"role": "", "content": "x"}]}),
    (CHAT, {"messages": []}),
    (CHAT, {"messages": [{"content": "x"}]}),
    (CHAT, {"messages": USER, "n": 0}),
    (CHAT, {"messages": USER, "n": 65}),
    (CHAT, {"messages": USER, "temperature": -0.1}),
    (CHAT, {"messages": USER, "temperature": 101}),
    (CHAT, {"messages": USER, "top_p": 0}),
    (CHAT, {"messages": USER, "top_k": -2}),
    (CHAT, {"messages": USER, "min_p": 1.5}),
    (CHAT, {"messages": USER, "repetition_penalty": 0}),
    (CHAT, {"messages": USER, "presence_penalty": 2.5}),
    (CHAT, {"messages": USER, "max_tokens": -1}),
    (CHAT, {"messages": USER, "max_completion_tokens": -1}),
    (CHAT, {"messages": USER, "max_tokens": 2**64}),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 21}),
    (CHAT, {"messages": USER, "stop": ""}),
    (CHAT, {"messages": USER, "stop": ["a"] * 17}),
    (CHAT, {"messages": USER, "logit_bias": {"1": 5}}),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    (CHAT, {"messages": USER, "response_format": {"type": "xml"}}),
    (CHAT, {"messages": USER, "response_format": {"type": "json_schema"}}),
    (
        CHAT,
        {
            "messages": USER,
            "response_format": {"type": "json_schema", "json_schema": {"schema": 3}},
        },
    ),
    (CHAT, {"messages": USER, "tool_choice": "sometimes"}),
    (CHAT, {"messages": USER, "tool_choice": {"type": "function"}}),
    (CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": ""}}]}),
    (CHAT, {"messages": USER, "tools": [{"type": "retrieval"}]}),
    (COMPLETION, {"prompt": []}),
    (COMPLETION, {"prompt": [-1]}),
    (COMPLETION, {"prompt": "x", "logprobs": 6}),
    (COMPLETION, {"prompt": "x", "best_of": 0}),
    (COMPLETION, {"prompt": "x", "max_tokens": -1}),
    (COMPLETION, {}),
    # Two fields' rules the schema states beside the Struct (core/docs.py BODY_RULES):
    (CHAT, {"messages": USER, "top_logprobs": 2}),  # needs logprobs: true
    (COMPLETION, {"prompt": ""}),  # empty: only a fill-in-the-middle gap may be
]
# Refused by the server only: these need two fields or the model, which JSON Schema cannot say.
CROSS_FIELD: list[tuple[str, dict]] = [
    (CHAT, {"messages": USER, "regex": "a", "ebnf": 'root ::= "a"'}),  # at most one constraint
    (CHAT, {"messages": USER, "stop_token_ids": [10**6]}),  # past the vocabulary
    (COMPLETION, {"prompt": "x", "best_of": 3}),  # must equal n
    (COMPLETION, {"prompt": "x", "suffix": "y"}),  # fill-in-the-middle: this model has no FIM
    (COMPLETION, {"prompt": [1, "a"]}),  # mixes token ids and strings
    (COMPLETION, {"prompt": [10**6]}),  # past the vocabulary
    (COMPLETION, {"prompt": "x", "echo": True, "stream": True, "logprobs": 1}),
]
ROUTES = {CHAT: "/chat/completions", COMPLETION: "/completions"}


@pytest.mark.parametrize("name, body", INVALID, ids=[json.dumps(b)[:60] for _, b in INVALID])
def test_invalid_bodies_are_refused_by_both_schema_and_server(fake, openapi, name, body):
    assert not validator(openapi, name).is_valid(body)
    r = post(fake, ROUTES[name], body, timeout=5)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] or "missing required field" in error["message"], error


@pytest.mark.parametrize(
    "name, body", CROSS_FIELD, ids=[json.dumps(b)[:60] for _, b in CROSS_FIELD]
)
def test_cross_field_errors_are_400s_naming_a_field(fake, openapi, name, body):
    assert validator(openapi, name).is_valid(body)
    r = post(fake, ROUTES[name], body, timeout=5)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"]


_numbers = st.sampled_from([None, -3, -1, 0, 0.5, 1, 2, 2.5, 16, 21, 64, 65, 101, 2**63, "1", True])
FIELDS: dict[str, Any] = {
    "temperature": _numbers,
    "top_p": _numbers,
    "top_k": _numbers,
    "min_p": _numbers,
    "presence_penalty": _numbers,
    "frequency_penalty": _numbers,
    "repetition_penalty": _numbers,
    "seed": _numbers,
    "n": st.sampled_from([None, -1, 0, 1, 2, 65, 1.5, "2"]),
    "max_tokens": st.sampled_from([None, -1, 0, 1, 3, 2**64, "3", 2.0]),
    "stop": st.sampled_from([None, "", "x", [], [""], ["a", "b"], ["a"] * 17, 3]),
    "top_logprobs": st.sampled_from([None, -1, 0, 5, 20, 21]),
    "role": st.sampled_from(["user", "assistant", "tool", "wizard", "", None, 1]),
    "response_format": st.sampled_from(
        [
            None,
            {"type": "text"},
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
            {"type": "xml"},
            {"type": "json_schema", "json_schema": {"name": "x"}},
            "json",
        ]
    ),
}


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_property_the_schema_accepts_exactly_what_the_server_accepts(fake, openapi, data):
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    for field in data.draw(st.sets(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=4)):
        value = data.draw(FIELDS[field], label=field)
        if field == "role":
            body["messages"] = [{"role": value, "content": "hi"}]
        elif value is not None:
            body[field] = value
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] > 3:
        body.setdefault("max_tokens", 3)  # keep valid requests short (an invalid one stays)
    schema_ok = validator(openapi, CHAT).is_valid(body)
    r = post(fake, "/chat/completions", body)
    assert r.status_code in (200, 400), r.text
    assert schema_ok == (r.status_code == 200), (body, r.text)


def test_every_status_the_routes_answer_is_declared(fake, openapi):
    model = httpx.get(fake.base + "/models", timeout=10).json()["data"][0]["id"]
    seen = [
        ("/v1/models/{model_id}", "get", httpx.get(fake.base + f"/models/{model}").status_code),
        ("/v1/models/{model_id}", "get", httpx.get(fake.base + "/models/nope").status_code),
        ("/v1/models", "get", httpx.get(fake.base + "/models").status_code),
        (
            "/v1/chat/completions",
            "post",
            post(fake, "/chat/completions", {"messages": []}).status_code,
        ),
        (
            "/v1/chat/completions",
            "post",
            post(fake, "/chat/completions", {"model": "x", "messages": USER}).status_code,
        ),
        ("/v1/cache/flush", "post", httpx.post(fake.base + "/cache/flush").status_code),
        ("/health", "get", httpx.get(fake.url + "/health").status_code),
    ]
    assert {status for *_, status in seen} == {200, 400, 404}
    for path, method, status in seen:
        assert str(status) in openapi["paths"][path][method]["responses"], (path, status)
