"""The Ollama API end to end: `localradix serve` on the bundled SmolLM2-135M-Instruct, driven by
the real `ollama` Python client (and httpx where the exact JSON matters). One server per module.

The field sets of /api/tags and /api/show are pinned exactly: Zed fails a whole model list over
one missing field, Roo Code drops models without "tools", Copilot reads `model_info` keys.
"""

from __future__ import annotations

import json
from datetime import datetime

import httpx
import jsonschema
import pytest

ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.slow

MODEL_KEYS = {"name", "model", "modified_at", "size", "digest", "details"}
DETAIL_KEYS = {
    "parent_model",
    "format",
    "family",
    "families",
    "parameter_size",
    "quantization_level",
}
SHOW_KEYS = {
    "license",
    "modelfile",
    "parameters",
    "template",
    "details",
    "model_info",
    "capabilities",
    "modified_at",
}
FINAL_KEYS = {
    "model",
    "created_at",
    "done",
    "done_reason",
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
}
GREEDY = {"temperature": 0, "num_predict": 4}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
# A few-shot conversation the small model continues (greedy) with the same hermes tool call:
# Ollama has no tool_choice, so this is how a test gets a call from a 135M model.
CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
TOOL_CHAT = [
    {"role": "system", "content": "You call tools. Answer only with a tool call like:\n" + CALL},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": CALL},
    {"role": "user", "content": "Weather in Paris?"},
]


@pytest.fixture(scope="module")
def oc(server):
    return ollama.Client(host=server.url, timeout=300)


@pytest.fixture(scope="module")
def name(oc):
    return oc.list().models[0].model


def test_listing_routes_have_exactly_the_fields_clients_parse(server, oc, name):
    assert httpx.get(server.url + "/").text == "Ollama is running"
    assert httpx.head(server.url + "/").status_code == 200
    version = httpx.get(server.url + "/api/version").json()["version"]
    assert tuple(int(p) for p in version.split(".")) >= (0, 6, 4)  # Copilot's minimum

    tags = httpx.get(server.url + "/api/tags").json()
    [model] = tags["models"]
    assert set(model) == MODEL_KEYS and set(model["details"]) == DETAIL_KEYS
    assert model["name"] == model["model"] == name
    assert len(model["digest"]) == 64 and int(model["digest"], 16) >= 0
    assert model["size"] > 50_000_000  # the GGUF file's size
    details = model["details"]
    assert details["format"] == "gguf" and details["family"] == "llama"
    assert details["families"] == ["llama"]
    assert details["parameter_size"] == "135M" and details["quantization_level"] == "Q4_1"
    datetime.fromisoformat(model["modified_at"].replace("Z", "+00:00"))

    show = httpx.post(server.url + "/api/show", json={"model": name}).json()
    assert set(show) == SHOW_KEYS and set(show["details"]) == DETAIL_KEYS
    info = show["model_info"]
    arch = info["general.architecture"]
    context = httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"]
    assert arch == "llama" and info[f"{arch}.context_length"] == context
    assert info["general.basename"]
    assert {"completion", "tools"} <= set(show["capabilities"])
    assert f"num_ctx {context}" in " ".join(show["parameters"].split())
    assert "im_start" in show["template"]

    # ... and the client's own models accept them.
    listed = oc.list().models[0]
    assert listed.details.family == "llama" and listed.size == model["size"]
    shown = oc.show(name + ":latest")
    assert shown.modelinfo[f"{arch}.context_length"] == context
    [running] = oc.ps().models
    assert running.model == name and running.context_length == context
    assert running.expires_at is not None and running.expires_at > datetime.now(
        running.expires_at.tzinfo
    )


def test_chat_streamed_and_not_agree_and_count_tokens(oc, name):
    messages = [{"role": "user", "content": "Say hi."}]
    whole = oc.chat(model=name, messages=messages, options=GREEDY, stream=False)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant" and whole.message.content
    assert 0 < whole.eval_count <= 4 and whole.prompt_eval_count > 5
    assert whole.total_duration >= whole.prompt_eval_duration > 0
    assert whole.eval_duration >= 0 and whole.load_duration == 0

    parts = list(oc.chat(model=name, messages=messages, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    last = parts[-1]
    assert last.eval_count == whole.eval_count
    # as Ollama's, prompt_eval_count leaves out what the cache served: all but the last token
    assert 1 <= last.prompt_eval_count < whole.prompt_eval_count


def test_chat_response_json_has_zeds_fields(server, name):
    body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "stream": False}
    r = httpx.post(server.url + "/api/chat", json={**body, "options": GREEDY}, timeout=300)
    assert r.status_code == 200
    data = r.json()
    assert set(data) == FINAL_KEYS | {"message"}
    assert set(data["message"]) == {"role", "content"}

    lines = []
    with httpx.stream(
        "POST", server.url + "/api/chat", json={**body, "stream": True}, timeout=300
    ) as s:
        assert s.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in s.iter_lines() if line]
    assert set(lines[-1]) == FINAL_KEYS | {"message"}
    assert all(set(p) == {"model", "created_at", "message", "done"} for p in lines[:-1])


def test_generate_templated_raw_and_options(oc, name):
    templated = oc.generate(model=name, prompt="Say hi.", options=GREEDY)
    assert templated.done and templated.response and templated.prompt_eval_count >= 1
    assert len(templated.context) > 5 + templated.eval_count  # the prompt's ids and the output's

    raw = oc.generate(
        model=name, prompt="1, 2, 3,", raw=True, options={"temperature": 0, "num_predict": 2}
    )
    assert raw.prompt_eval_count == 8 and raw.eval_count == 2 and raw.done_reason == "length"
    stopped = oc.generate(
        model=name,
        prompt="1, 2, 3,",
        raw=True,
        options={"temperature": 0, "num_predict": 8, "stop": [","]},
    )
    assert stopped.done_reason == "stop" and "," not in stopped.response
    assert stopped.response.strip() == "4"

    seeded = {
        "temperature": 1.5,
        "top_k": 0,
        "top_p": 0.95,
        "min_p": 0.0,
        "seed": 7,
        "num_predict": 6,
    }
    seeded |= {
        "repeat_penalty": 1.1,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.1,
        "num_ctx": 4096,
    }
    first = [
        p.response
        for p in oc.generate(model=name, prompt="Once", raw=True, options=seeded, stream=True)
    ]
    again = oc.generate(model=name, prompt="Once", raw=True, options=seeded, keep_alive="5m")
    assert "".join(first) == again.response


def test_format_schema_and_json(oc, name):
    schema = {
        "type": "object",
        "properties": {"color": {"type": "string", "maxLength": 10}},
        "required": ["color"],
        "additionalProperties": False,
    }
    opts = {"temperature": 0, "num_predict": 40}
    r = oc.generate(model=name, prompt="Name a color.", format=schema, options=opts)
    jsonschema.validate(json.loads(r.response), schema)
    c = oc.chat(
        model=name, messages=[{"role": "user", "content": "A color?"}], format=schema, options=opts
    )
    jsonschema.validate(json.loads(c.message.content), schema)
    parts = oc.chat(
        model=name,
        messages=[{"role": "user", "content": "A color?"}],
        format=schema,
        options=opts,
        stream=True,
    )
    jsonschema.validate(json.loads("".join(p.message.content or "" for p in parts)), schema)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_have_object_arguments_and_results_go_back(oc, name, stream):
    opts = {"temperature": 0, "num_predict": 40}
    parts = oc.chat(model=name, messages=TOOL_CHAT, tools=TOOLS, options=opts, stream=stream)
    calls = [c for p in (parts if stream else [parts]) for c in p.message.tool_calls or ()]
    assert len(calls) == 1
    assert calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == {"city": "Paris"}  # an object, not JSON text
    follow = [
        *TOOL_CHAT,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [calls[0].model_dump(exclude_none=True)],
        },
        {"role": "tool", "tool_name": "get_weather", "content": '{"temperature": 21}'},
    ]
    r = oc.chat(model=name, messages=follow, tools=TOOLS, options=GREEDY)
    assert r.done and r.prompt_eval_count >= 1  # only what the cache did not hold


def test_empty_prompt_loads_or_unloads(oc, name):
    assert oc.generate(model=name, prompt="").done_reason == "load"
    assert oc.generate(model=name, prompt="", keep_alive=0).done_reason == "unload"
    assert oc.chat(model=name, messages=[], keep_alive="0s").done_reason == "unload"


def test_a_chat_model_cannot_embed_on_either_dialect(server, oc, name):
    """The bundled chat model: a 400 that says it cannot embed and names a model that can."""
    import openai

    client = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=name, input="hello")
    assert "cannot embed" in err.value.message and "Qwen3-Embedding" in err.value.message
    for call in (lambda: oc.embed(model=name, input="hello"), lambda: oc.embeddings(name, "hi")):
        with pytest.raises(ollama.ResponseError) as o_err:
            call()
        assert o_err.value.status_code == 400 and "Qwen3-Embedding" in o_err.value.error
    assert "embedding" not in oc.show(name).capabilities


def test_bad_input_gets_ollama_shaped_4xx_and_the_server_stays_healthy(server, oc, name):
    cases = [
        ("/api/chat", b"{", 400),
        ("/api/chat", b"[]", 400),
        ("/api/generate", b'{"model": 5, "prompt": "x"}', 400),
        ("/api/chat", json.dumps({"model": name, "messages": "hi"}).encode(), 400),
        (
            "/api/chat",
            json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).encode(),
            404,
        ),
        ("/api/generate", json.dumps({"prompt": "x"}).encode(), 400),
        (
            "/api/generate",
            json.dumps({"model": name, "prompt": "x", "options": {"temperature": "hot"}}).encode(),
            400,
        ),
        (
            "/api/generate",
            json.dumps({"model": name, "prompt": "x", "options": {"top_p": 7}}).encode(),
            400,
        ),
        (
            "/api/generate",
            json.dumps({"model": name, "prompt": "x", "options": {"num_predict": -3}}).encode(),
            400,
        ),
        (
            "/api/generate",
            json.dumps({"model": name, "prompt": "x", "format": "xml"}).encode(),
            400,
        ),
        (
            "/api/generate",
            json.dumps({"model": name, "prompt": "x", "keep_alive": "soon"}).encode(),
            400,
        ),
        ("/api/generate", json.dumps({"model": name, "prompt": "x", "suffix": "y"}).encode(), 400),
        (
            "/api/generate",
            json.dumps({"model": name, "prompt": "x", "images": ["aGk="]}).encode(),
            400,
        ),
        ("/api/generate", json.dumps({"model": name, "prompt": "x", "think": True}).encode(), 400),
        (
            "/api/generate",
            json.dumps({"model": name, "prompt": "hello " * 9000, "raw": True}).encode(),
            400,
        ),
        ("/api/show", json.dumps({"model": "nope"}).encode(), 404),
        ("/api/embed", json.dumps({"model": name, "input": "x"}).encode(), 400),
        ("/api/embeddings", json.dumps({"model": name, "prompt": "x"}).encode(), 400),
        ("/api/pull", json.dumps({"model": "llama3"}).encode(), 400),  # not a repo id
    ]
    headers = {"content-type": "application/json"}
    for path, body, status in cases:
        r = httpx.post(server.url + path, content=body, headers=headers, timeout=60)
        assert r.status_code == status, (path, body[:80], r.text)
        data = r.json()
        assert set(data) == {"error"} and isinstance(data["error"], str) and data["error"], data
    r = httpx.request("DELETE", server.url + "/api/delete", json={"model": "no-such-model"})
    assert r.status_code == 404 and "not found" in r.json()["error"]

    with pytest.raises(ollama.ResponseError) as err:
        oc.chat(model="nope", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 404 and "nope" in err.value.error
    assert httpx.get(server.url + "/health").status_code == 200


def _idle(server) -> bool:
    stats = httpx.get(server.base + "/stats").json()
    return stats["server"]["in_flight"] == 0 and stats["engine"]["running"] == 0


def _finished(server) -> int:
    """Requests that ran to their end (an aborted one is not counted)."""
    return httpx.get(server.base + "/stats").json()["server"]["requests_total"]


def test_a_client_that_leaves_aborts_its_job(fake_server):
    """On the fake engine (endless output): a dropped NDJSON stream or a non-streamed request
    whose client times out frees its engine request."""
    from server_harness import wait_until

    finished = _finished(fake_server)
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "x"}],
        "options": {"num_predict": 100000},
    }
    with httpx.stream("POST", fake_server.url + "/api/chat", json=body) as r:
        lines = r.iter_lines()  # kept: a dropped iterator closes the connection
        assert json.loads(next(lines))["done"] is False
        assert wait_until(lambda: not _idle(fake_server))
    assert wait_until(lambda: _idle(fake_server))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            fake_server.url + "/api/generate",
            json={**body, "prompt": "x", "stream": False},
            timeout=0.5,
        )
    assert wait_until(lambda: _idle(fake_server))
    assert _finished(fake_server) == finished  # both were aborted, not run to the end
