"""OpenAI's Responses API end to end: `localradix serve` on the bundled SmolLM2-135M-Instruct,
driven by the real `openai` SDK (`client.responses`), plus httpx for the bad-input battery.
One server per module."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": CITY,
}
FORCED = {"type": "function", "name": "get_weather"}
ASK = "What is the weather in Paris?"
GREEDY = {"temperature": 0}


def test_a_response_is_the_chat_completion_of_the_same_messages(client, model):
    r = client.responses.create(
        model=model, input="Say hi.", instructions="Be brief.", max_output_tokens=8, **GREEDY
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.model == model
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert r.status in ("completed", "incomplete") and item.status == r.status
    chat = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hi."},
        ],
        max_tokens=8,
        **GREEDY,
    )
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 8
    assert r.instructions == "Be brief." and r.max_output_tokens == 8 and r.temperature == 0


def test_stream_events_come_in_the_sdks_order(client, model):
    kw = dict(model=model, input="Say hi.", max_output_tokens=6, **GREEDY)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    head = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    tail = [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # 6 tokens do not finish the greeting
    ]
    assert kinds[:4] == head and kinds[-4:] == tail, kinds
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    whole = client.responses.create(**kw)
    assert final.output_text == whole.output_text == text == events[-4].text
    assert final.id == events[0].response.id and final.output[0].id == events[2].item.id
    assert final.usage.output_tokens == whole.usage.output_tokens == 6
    assert final.incomplete_details.reason == "max_output_tokens"


def test_function_call_round_trip(client, model):
    kw = dict(model=model, input=ASK, tools=[WEATHER], tool_choice=FORCED, **GREEDY)
    with client.responses.stream(max_output_tokens=100, **kw) as s:  # the SDK's strict helper
        events = list(s)
        r = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "function_call"
    assert "response.function_call_arguments.delta" in kinds
    done = kinds.index("response.function_call_arguments.done")
    assert kinds[done + 1 :] == ["response.output_item.done", "response.completed"]
    assert r.status == "completed"
    [call] = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), CITY)
    whole = client.responses.create(max_output_tokens=100, **kw)
    assert [(c.type, c.name, c.arguments) for c in whole.output] == [
        ("function_call", call.name, call.arguments)
    ]

    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}
    resend = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), result]
    # tool_choice "none": the answer is text (the 135M model would call again, cut at 4 tokens).
    answer = dict(tools=[WEATHER], tool_choice="none", max_output_tokens=4, **GREEDY)
    resent = client.responses.create(model=model, input=resend, **answer)
    follow = client.responses.create(
        model=model, previous_response_id=r.id, input=[result], **answer
    )
    assert follow.output_text == resent.output_text and follow.output_text
    assert follow.usage.input_tokens == resent.usage.input_tokens > 40
    assert follow.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "json_schema", "name": "city", "schema": CITY, "strict": True},
        {"type": "json_object"},
    ],
)
def test_text_format_constrains_the_output(client, model, fmt):
    r = client.responses.create(
        model=model,
        input="Which city is the capital of France? Answer in JSON.",
        text={"format": fmt},
        max_output_tokens=40,
        **GREEDY,
    )
    value = json.loads(r.output_text)
    if fmt["type"] == "json_schema":
        jsonschema.validate(value, CITY)
        assert r.text.format.type == "json_schema" and r.text.format.name == "city"
    assert isinstance(value, dict)


def test_previous_response_id_is_served_from_the_radix_cache(client, model):
    rules = " ".join(f"Rule {i}: answer politely and briefly." for i in range(20))
    first = client.responses.create(
        model=model, input=f"{rules}\nName a colour.", max_output_tokens=6, **GREEDY
    )
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input="Name another one.",
        max_output_tokens=6,
        **GREEDY,
    )
    assert second.previous_response_id == first.id
    assert first.usage.input_tokens > 150
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    # The continuation's prompt is the whole conversation, as if the client had resent it.
    resent = client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": f"{rules}\nName a colour."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "Name another one."},
        ],
        max_output_tokens=6,
        **GREEDY,
    )
    assert resent.usage.input_tokens == second.usage.input_tokens
    assert resent.output_text == second.output_text
    kept = client.responses.retrieve(first.id)
    assert kept.id == first.id and kept.output_text == first.output_text


def _refused(client, model, previous: str, stream: bool = False) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=model, previous_response_id=previous, input="And?", stream=stream
        )
    error = caught.value.body
    assert error["code"] == "previous_response_not_found"
    assert error["param"] == "previous_response_id" and previous in error["message"]
    return caught.value


def test_unknown_unkept_and_evicted_previous_ids_are_400s(server, client, model):
    _refused(client, model, "resp_unknown")
    unkept = client.responses.create(model=model, input="Hi", max_output_tokens=2, store=False)
    assert unkept.store is False
    _refused(client, model, unkept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)

    first = client.responses.create(model=model, input="Hi", max_output_tokens=2, **GREEDY)
    assert httpx.post(server.url + "/flush_cache").status_code == 200
    for stream in (False, True):
        err = _refused(client, model, first.id, stream)
        assert "no longer in the radix cache" in err.body["message"]
    # The whole input still works, and the id stays known (a retry after the client resent).
    again = client.responses.create(model=model, input="Hi", max_output_tokens=2, **GREEDY)
    assert again.output_text == first.output_text
    assert client.responses.retrieve(first.id).id == first.id


def test_bad_input_gets_openai_shaped_4xx_and_the_server_stays_healthy(server, model):
    ok = {"model": model, "input": "Hi", "max_output_tokens": 4}
    cases = [
        (b"{", 400),
        (b"[]", 400),
        ({"model": model}, 400),  # no input
        ({**ok, "input": 5}, 400),
        ({**ok, "input": []}, 400),
        ({**ok, "input": ""}, 400),
        ({**ok, "max_output_tokens": 0}, 400),
        ({**ok, "max_output_tokens": "4"}, 400),
        ({**ok, "model": "gpt-5"}, 404),
        ({**ok, "input": "hello " * 9000}, 400),
        ({**ok, "temperature": 250}, 400),
        ({**ok, "top_p": 3}, 400),
        ({**ok, "input": [{"role": "user", "content": [{"type": "input_image"}]}]}, 400),
        ({**ok, "input": [{"role": "tool", "content": "x"}]}, 400),
        ({**ok, "input": [{"type": "item_reference", "id": "x"}]}, 400),
        ({**ok, "input": [{"type": "function_call_output", "output": "x"}]}, 400),
        ({**ok, "tools": [{"type": "web_search"}]}, 400),
        ({**ok, "tools": [WEATHER], "tool_choice": {"type": "allowed_tools"}}, 400),
        ({**ok, "tools": [WEATHER], "tool_choice": "sometimes"}, 400),
        ({**ok, "text": {"format": {"type": "xml"}}}, 400),
        ({**ok, "text": {"format": {"type": "json_schema", "name": "x"}}}, 400),
    ]
    for body, status in cases:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(
            server.base + "/responses",
            content=raw,
            headers={"content-type": "application/json"},
            timeout=60,
        )
        assert r.status_code == status, (raw[:100], r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
    long = httpx.post(server.base + "/responses", json={**ok, "max_output_tokens": 0}).json()
    assert "max_output_tokens" in long["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_without_the_radix_cache_nothing_can_be_continued():
    """On the fake engine with --disable-radix-cache: a clear 400, not a silent re-prefill."""
    from server_harness import start_server

    fake = start_server(["--disable-radix-cache"], fake=True)
    try:
        client = openai.OpenAI(base_url=fake.base, api_key="unused", max_retries=0)
        first = client.responses.create(model="fake-model", input="Hi", max_output_tokens=3)
        assert first.output_text
        err = _refused(client, "fake-model", first.id)
        assert "--disable-radix-cache" in err.body["message"]
    finally:
        fake.stop()


def test_response_ids_cannot_be_guessed(client, model):
    """Ids name stored responses (GET / DELETE /v1/responses/{id}): 96 random bits each, so a
    caller cannot reach another's by counting from its own."""
    ids = [
        client.responses.create(model=model, input=ASK, max_output_tokens=1, **GREEDY).id
        for _ in range(3)
    ]
    for rid in ids:
        assert re.fullmatch(r"resp_[0-9a-f]{24}", rid), rid
    prefixes = {rid[: len("resp_") + 12] for rid in ids}
    assert len(prefixes) == 3  # no shared counter prefix


def test_with_several_keys_a_stored_response_is_its_own_keys(tmp_path):
    """--api-key-file lists one key per line: each opens the server, and what one key's caller
    stored cannot be read, continued or deleted with another (a 404 / 400 as for any unknown
    id, so its existence does not leak)."""
    from server_harness import start_server

    keys = tmp_path / "keys.txt"
    keys.write_text("# one per tool\nkey-alice\n\nkey-bob\n")
    fake = start_server(["--api-key-file", str(keys)], fake=True)
    try:
        alice, bob = (
            openai.OpenAI(base_url=fake.base, api_key=key, max_retries=0)
            for key in ("key-alice", "key-bob")
        )
        rid = alice.responses.create(model="fake-model", input="Hi", max_output_tokens=3).id
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(rid)
        with pytest.raises(openai.NotFoundError):
            bob.responses.delete(rid)
        assert "is not kept" in _refused(bob, "fake-model", rid).body["message"]
        assert alice.responses.retrieve(rid).id == rid
        follow = alice.responses.create(
            model="fake-model", input="Again", previous_response_id=rid, max_output_tokens=3
        )
        assert follow.previous_response_id == rid
        alice.responses.delete(rid)
        with pytest.raises(openai.NotFoundError):
            alice.responses.retrieve(rid)
        stranger = openai.OpenAI(base_url=fake.base, api_key="key-eve", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            stranger.responses.create(model="fake-model", input="Hi", max_output_tokens=3)
    finally:
        assert fake.stop() == 0
