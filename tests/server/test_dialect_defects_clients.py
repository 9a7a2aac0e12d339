"""Defects real clients found in the dialects, pinned with those clients against `localradix
serve` on the bundled SmolLM2-135M-Instruct (one server per module):

- openai: a Responses stream that max_output_tokens cuts ends in `response.incomplete`, as
  OpenAI's does (the installed SDK's `get_final_response()` accepts only `response.completed`:
  openai/openai-python#3538 is open), and the response says why;
- anthropic: `client.models.list()` / `.retrieve()` get Anthropic's shape on the same path where
  the openai SDK gets OpenAI's;
- ollama: `prompt_eval_count` leaves out what the cache served, and `/api/generate` returns a
  `context` that a next request continues from the cache;
- errors on `/v1/responses` name the Responses field (`input`, not the chat core's `messages`).
"""

from __future__ import annotations

from datetime import datetime

import anthropic
import httpx
import openai
import pytest

from localradix.server.anthropic.render import model_page
from localradix.server.errors import APIError

ollama = pytest.importorskip("ollama")

ANTHROPIC_VERSION = {"anthropic-version": "2023-06-01"}
OLLAMA_GREEDY = {"temperature": 0, "num_predict": 6}
TOO_LONG = "hello " * 9000  # over the bundled model's 8,192-token context


@pytest.fixture(scope="module")
def ac(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def oc(server):
    return ollama.Client(host=server.url, timeout=300)


# ---- Responses: a stream cut by max_output_tokens ------------------------------------------


def _final_or_none(stream):
    """The SDK's final response, or None where the SDK only accepts response.completed."""
    try:
        return stream.get_final_response()
    except RuntimeError as exc:
        assert "response.completed" in str(exc)
        return None


@pytest.mark.slow
def test_a_stream_cut_by_max_output_tokens_ends_as_openai_ends_it(client, model):
    kw = dict(model=model, input="Tell me a long story.", max_output_tokens=5, temperature=0)
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = _final_or_none(stream)
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.incomplete" and "response.completed" not in kinds
    cut = events[-1].response
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output[-1].status == "incomplete" and cut.usage.output_tokens == 5
    assert final is None or (final.status == "incomplete" and final.id == cut.id)

    whole = client.responses.create(**kw)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output[-1].status == "incomplete" and whole.output_text == cut.output_text


@pytest.mark.slow
def test_a_stream_that_finishes_still_ends_in_response_completed(client, model):
    kw = dict(model=model, input="Say hi.", max_output_tokens=200, temperature=0)
    with client.responses.stream(**kw) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed" and final.status == "completed"
    assert final.incomplete_details is None


# ---- Anthropic's model list ------------------------------------------------------------------


@pytest.mark.slow
def test_the_anthropic_sdk_lists_and_retrieves_models_in_anthropics_shape(server, ac, model):
    page = ac.models.list()
    assert page.data[0].id == model and all(m.type == "model" for m in page.data)
    assert page.data[0].display_name == model and page.data[0].created_at.tzinfo is not None
    assert page.first_id == page.data[0].id and page.last_id == page.data[-1].id
    assert page.has_more is False
    one = ac.models.list(limit=1)
    assert [m.id for m in one.data] == [model] and one.has_more == (len(page.data) > 1)

    info = ac.models.retrieve(model)
    assert info.id == model and info.max_input_tokens == 8192
    with pytest.raises(anthropic.NotFoundError):
        ac.models.retrieve("no-such-model")
    with pytest.raises(anthropic.BadRequestError):
        ac.models.list(limit=0)

    raw = httpx.get(server.base + "/models", headers=ANTHROPIC_VERSION).json()
    assert set(raw) == {"data", "has_more", "first_id", "last_id"}
    stamp = raw["data"][0]["created_at"]
    assert stamp.endswith("Z") and datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    missing = httpx.get(server.base + "/models/no-such-model", headers=ANTHROPIC_VERSION)
    assert missing.status_code == 404 and missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "not_found_error"


@pytest.mark.slow
def test_the_openai_sdk_and_an_x_api_key_alone_still_get_openais_shape(server, client, model):
    listed = client.models.list().data
    assert listed[0].id == model and listed[0].object == "model"
    assert isinstance(listed[0].created, int) and client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.body["param"] == "model"

    keyed = httpx.get(server.base + "/models", headers={"x-api-key": "unused"}).json()
    assert keyed["object"] == "list" and keyed["data"][0]["object"] == "model"


def test_anthropic_model_pages_follow_after_id_and_before_id():
    infos = [{"id": f"m{i}"} for i in range(5)]

    def ids(page):
        return [m["id"] for m in page["data"]], page["has_more"], page["first_id"], page["last_id"]

    assert ids(model_page(infos, None, None, 2)) == (["m0", "m1"], True, "m0", "m1")
    assert ids(model_page(infos, "m1", None, 2)) == (["m2", "m3"], True, "m2", "m3")
    assert ids(model_page(infos, "m3", None, 2)) == (["m4"], False, "m4", "m4")
    assert ids(model_page(infos, "m4", None, 2)) == ([], False, None, None)
    assert ids(model_page(infos, None, "m4", 2)) == (["m2", "m3"], True, "m2", "m3")
    assert ids(model_page(infos, None, "m2", 5)) == (["m0", "m1"], False, "m0", "m1")
    with pytest.raises(APIError) as unknown:
        model_page(infos, "gone", None, 2)
    assert unknown.value.status == 400 and unknown.value.param == "after_id"


# ---- Ollama: prompt_eval_count and generate's context ---------------------------------------


def _last(reply, stream):
    return list(reply)[-1] if stream else reply


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["chat", "generate"])
def test_prompt_eval_count_leaves_out_the_tokens_the_cache_served(server, oc, model, route, stream):
    text = f"Name a {route} colour ({'streamed' if stream else 'whole'})."
    whole = httpx.post(server.url + "/tokenize", json={"messages": [user(text)]}).json()["count"]

    def ask():
        if route == "chat":
            reply = oc.chat(
                model=model, messages=[user(text)], options=OLLAMA_GREEDY, stream=stream
            )
        else:
            reply = oc.generate(model=model, prompt=text, options=OLLAMA_GREEDY, stream=stream)
        return _last(reply, stream)

    first, again = ask(), ask()
    assert 1 <= again.prompt_eval_count < first.prompt_eval_count <= whole
    assert again.eval_count == first.eval_count


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_generate_returns_context_and_continues_from_the_cache(server, oc, model, stream):
    text = f"My name is Ada ({'streamed' if stream else 'whole'}). Say hi."
    prompt = httpx.post(server.url + "/tokenize", json={"messages": [user(text)]}).json()
    first = _last(
        oc.generate(model=model, prompt=text, options=OLLAMA_GREEDY, stream=stream), stream
    )
    assert first.context[: prompt["count"]] == prompt["tokens"]
    assert len(first.context) == prompt["count"] + first.eval_count

    reply = oc.generate(
        model=model,
        prompt="What is my name?",
        context=first.context,
        options=OLLAMA_GREEDY,
        stream=stream,
    )
    after = _last(reply, stream)
    assert after.context[: len(first.context)] == first.context
    new_prompt = len(after.context) - after.eval_count - len(first.context)
    assert 0 < after.prompt_eval_count <= new_prompt + 1  # only the new turn was evaluated


@pytest.mark.slow
def test_raw_generate_has_no_context_and_bad_context_is_a_400(oc, model):
    raw = oc.generate(model=model, prompt="1, 2, 3,", raw=True, options=OLLAMA_GREEDY)
    assert raw.context is None
    for kw in ({"raw": True, "context": [1, 2]}, {"context": [1, 10**9]}):
        with pytest.raises(ollama.ResponseError) as refused:
            oc.generate(model=model, prompt="Hi", options=OLLAMA_GREEDY, **kw)
        assert refused.value.status_code == 400 and "context" in refused.value.error


# ---- Responses: errors name the Responses field ---------------------------------------------

IMAGE = {"type": "input_image", "image_url": "https://example.com/a.png"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": TOO_LONG}, "input"),
        ({"input": TOO_LONG, "stream": True}, "input"),
        ({"input": [user("Hi"), {"role": "user", "content": [IMAGE]}]}, "input[1].content[0]"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
            "input[0].content[0].text",
        ),
        ({"input": "Hi", "instructions": 5}, "instructions"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
        (
            {"input": "Hi", "text": {"format": {"type": "json_schema", "schema": {"type": "x"}}}},
            "text.format",
        ),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ],
)
def test_a_400_on_responses_names_the_responses_field(client, model, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model, **fields)
    assert refused.value.param == param, refused.value.body
    assert "messages" not in str(refused.value.body)
