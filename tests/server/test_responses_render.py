"""The Responses dialect without a server: input items as chat messages, the kept-responses LRU,
and one output (reasoning, text, a tool call) rendered whole and as the typed SSE events, which
the openai SDK's own stream accumulator must take and rebuild into the same response."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai._models import construct_type
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from localradix.server.core.jobs import cached_continuation
from localradix.server.core.output import ChatOutputSpec
from localradix.server.errors import APIError
from localradix.server.responses import render
from localradix.server.responses.protocol import InputItem
from localradix.server.responses.request import input_messages
from localradix.server.responses.store import ResponseStore
from localradix.server.responses.stream import response_events
from localradix.server.tokenizer_manager import Delta

CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
USAGE = {"prompt_tokens": 9, "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 4}}
FIELDS = {"model": "m", "tools": [], "tool_choice": "auto", "parallel_tool_calls": True}


def fake_job(text: str, finish: str = "stop") -> Any:
    """A finished job whose output is `text`, delivered 5 characters at a time."""
    batches = [[Delta(0, text[i : i + 5])] for i in range(0, len(text), 5)]
    batches.append([Delta(0, "", finish_reason=finish)])

    async def deltas():
        for batch in batches:
            yield batch

    tokenizer = SimpleNamespace(encode=lambda t, special: list(t.encode()))
    return SimpleNamespace(
        rid="r1",
        created=7,
        manager=SimpleNamespace(tokenizer=tokenizer, metrics=SimpleNamespace()),
        output=ChatOutputSpec("hermes", "qwen3", None, ("f",)),
        deltas=deltas,
        close=lambda: None,
        usage=lambda: USAGE,
    )


def streamed(job: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The events of `job`'s stream, and the response objects it kept."""
    kept: list[dict[str, Any]] = []

    async def collect() -> list[bytes]:
        return [chunk async for chunk in response_events(job, FIELDS, kept.append)]

    events = []
    for chunk in asyncio.run(collect()):
        head, data = chunk.decode().strip().split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        events.append(event)
    return events, kept


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_streamed_and_whole_outputs_agree_and_the_sdk_rebuilds_them(finish):
    text = "<think>hmm, think</think>The answer." + CALL
    events, kept = streamed(fake_job(text, finish))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    last = "response.completed" if finish == "stop" else "response.incomplete"
    assert kinds[-1] == last and [e["sequence_number"] for e in events] == list(range(len(events)))
    body = events[-1]["response"]
    assert kept == [body]
    whole = render.output_items(fake_job(text), fake_job(text).output.parse(text), finish)
    call_ids = [i["call_id"] for i in body["output"] if i["type"] == "function_call"]
    for item in whole:  # the same items (a call's id is new for every parse)
        if item["type"] == "function_call":
            item.update(call_id=call_ids[0], id=f"fc_{call_ids[0]}")
    assert body["output"] == whole
    assert [i["type"] for i in whole] == ["reasoning", "message", "function_call"]
    assert whole[0]["content"] == [{"type": "reasoning_text", "text": "hmm, think"}]
    assert json.loads(whole[2]["arguments"]) == {"x": 1}
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == len("hmm, think")
    assert body["usage"]["input_tokens_details"]["cached_tokens"] == 4
    assert body["status"] == ("completed" if finish == "stop" else "incomplete")
    # The openai SDK's own accumulator (what responses.stream() runs) takes every event.
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[], text_format=omit)
    for event in events:
        state.handle_event(construct_type(value=event, type_=ResponseStreamEvent))
    if finish == "stop":
        final = state._completed_response
        assert final is not None and final.output_text == "The answer."
        assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]


def test_an_empty_answer_is_one_empty_message():
    events, _ = streamed(fake_job(""))
    assert [i["content"] for i in events[-1]["response"]["output"]] == [[render.text_part("")]]


def test_an_engine_error_mid_stream_is_an_error_event_then_response_failed():
    job = fake_job("abc")

    async def deltas():
        yield [Delta(0, "ab")]
        raise APIError(503, "the engine is gone")

    job.deltas = deltas
    job.manager.metrics.record_error = lambda status: None
    events, kept = streamed(job)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-2]["message"] == "the engine is gone" and kept == []
    assert events[-1]["response"]["status"] == "failed"


def items(*raw: dict[str, Any]) -> list[InputItem]:
    return msgspec.convert(list(raw), list[InputItem])


def test_input_items_become_chat_messages():
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'}
    messages = input_messages(
        items(
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "t"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}],
            },
            call,
            {**call, "call_id": "c2"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2", "output": "two"},
        )
    )
    tool_calls = [
        {"id": c, "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
        for c in ("c1", "c2")
    ]
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "a", "reasoning_content": "t", "tool_calls": tool_calls},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    assert input_messages("Hi") == [{"role": "user", "content": "Hi"}]
    assert render.assistant_turn(
        [
            render.reasoning_item(fake_job(""), "t", "completed"),
            render.message_item(fake_job(""), "a", "completed"),
            render.call_item("c1", "f", '{"x": 1}', "completed"),
        ]
    ) == {
        "role": "assistant",
        "content": "a",
        "reasoning_content": "t",
        "tool_calls": tool_calls[:1],
    }


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=60))
def test_the_store_keeps_the_most_recently_used(ops):
    store, recent = ResponseStore(capacity=4), []
    for put, n in ops:
        key = f"resp_{n}"
        if put:
            store.put({"id": key}, [], [n])
        elif store.get(key) is None:
            assert key not in recent[-4:]
            continue
        recent = [k for k in recent if k != key] + [key]
        assert len(store) == min(len(recent), 4)
        assert all(store._kept.get((None, k)) is not None for k in recent[-4:])


def test_the_store_keeps_a_response_for_its_owner_only():
    store = ResponseStore()
    store.put({"id": "resp_1"}, [], [1], owner="alice")
    assert store.get("resp_1") is None and store.get("resp_1", "bob") is None
    assert not store.pop("resp_1", "bob")
    assert store.get("resp_1", "alice") is not None
    assert store.pop("resp_1", "alice") and len(store) == 0


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_cached_continuation_is_the_common_prefix_less_the_last_output_token(ids, earlier):
    n = cached_continuation(ids, earlier)
    assert ids[:n] == earlier[:n] and n <= max(len(earlier) - 1, 0)
    assert n == max(min(len(ids), len(earlier) - 1), 0) or ids[n] != earlier[n]
