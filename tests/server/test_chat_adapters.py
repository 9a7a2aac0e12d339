"""Each dialect's adapter builds the one neutral ChatRequest, and its errors name the dialect's
own fields; the shared stream parser splits parser events once, for every choice."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from localradix.parsers.events import ContentDelta, ToolCallDelta
from localradix.parsers.output_parser import ReasoningContentDelta
from localradix.server.anthropic.protocol import MessagesRequest
from localradix.server.anthropic.request import chat_request as anthropic_chat
from localradix.server.core.body import decode
from localradix.server.core.chat_request import ChatRequest, ParamNames, Sampling
from localradix.server.core.chat_template import chat_text
from localradix.server.core.output import ChatOutputSpec, tool_setup
from localradix.server.core.parsed import ParsedStream, runs, split
from localradix.server.core.sampling import sampling_params
from localradix.server.core.served import openai_not_found, served_model
from localradix.server.errors import APIError
from localradix.server.ollama.protocol import ChatBody
from localradix.server.ollama.request import chat_request as ollama_chat
from localradix.server.openai.request import chat_request as openai_chat
from localradix.server.protocol import ChatCompletionRequest
from localradix.server.responses.protocol import ResponsesRequest
from localradix.server.responses.request import chat_request as responses_chat
from localradix.server.tokenizer_manager import Delta

HI = [{"role": "user", "content": "hi"}]


def manager(**more: Any) -> Any:
    return SimpleNamespace(
        client=SimpleNamespace(loaded=SimpleNamespace(name="m")),
        names={"m", "alias"},
        args=SimpleNamespace(keep_billing_header=False),
        reasoning_parser=None,
        tool_parser=None,
        **more,
    )


def body(type_: Any, **fields: Any) -> Any:
    return decode(json.dumps(fields).encode(), type_)


def refused(build: Any) -> APIError:
    with pytest.raises(APIError) as err:
        build()
    return err.value


# ---- what each adapter builds ----------------------------------------------------------------


def test_openai_adapter_reads_its_fields_into_the_neutral_request():
    req = body(
        ChatCompletionRequest,
        model="m",
        messages=HI,
        max_completion_tokens=7,
        max_tokens=3,
        logprobs=True,
        top_logprobs=2,
        reasoning_effort="none",
        stop="x",
        response_format={"type": "json_object"},
        stream=True,
        keep_alive="5m",
    )
    chat = openai_chat(manager(), req)
    assert isinstance(chat, ChatRequest) and chat.stream
    assert chat.messages == HI
    assert (chat.max_tokens, chat.logprobs, chat.sampling.stop) == (7, 2, ("x",))
    assert chat.names("max_tokens") == "max_completion_tokens"
    assert chat.template_kwargs == {"reasoning_effort": "low", "enable_thinking": False}
    assert chat.constraint is not None and chat.constraint.kind == "json_object"
    assert chat.constraint_param == "response_format"
    assert req.keep_alive == "5m"  # decoded with the request, never a second time


def test_anthropic_adapter_names_its_own_fields():
    req = body(
        MessagesRequest,
        model="m",
        max_tokens=9,
        messages=HI,
        stop_sequences=["END"],
        top_k=5,
        thinking={"type": "disabled"},
        output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}},
    )
    chat = anthropic_chat(manager(), req)
    assert (chat.model, chat.max_tokens, chat.sampling.stop) == ("m", 9, ("END",))
    assert chat.sampling.top_k == 5 and chat.reasoning_effort == "none"
    assert chat.template_kwargs["enable_thinking"] is False
    assert chat.constraint_param == "output_config.format"
    empty = {**msgspec.to_builtins(req), "stop_sequences": [""], "output_config": None}
    err = refused(lambda: anthropic_chat(manager(), msgspec.convert(empty, MessagesRequest)))
    assert err.param == "stop_sequences[0]" and "'stop_sequences[0]'" in err.message
    hot = {**msgspec.to_builtins(req), "temperature": 200.0}
    err = refused(lambda: anthropic_chat(manager(), msgspec.convert(hot, MessagesRequest)))
    assert err.param == "temperature" and "<= 100.0" in err.message


def test_ollama_adapter_names_its_own_options():
    ok = {"model": "m:latest", "messages": HI, "format": "json", "stream": False}
    chat = ollama_chat(manager(), body(ChatBody, **ok, options={"num_predict": 4, "top_k": 0}))
    assert (chat.model, chat.max_tokens, chat.sampling.top_k, chat.stream) == ("m", 4, -1, False)
    assert chat.constraint is not None and chat.constraint_param == "format"
    err = refused(
        lambda: ollama_chat(manager(), body(ChatBody, **ok, options={"repeat_penalty": 20}))
    )
    assert err.param == "repeat_penalty" and "(at 'repeat_penalty')" in err.message
    bad_role = {**ok, "messages": [{"role": "robot", "content": "x"}]}
    assert refused(lambda: ollama_chat(manager(), body(ChatBody, **bad_role))).param == (
        "messages[0].role"
    )
    other = {**ok, "model": "other"}
    assert refused(lambda: ollama_chat(manager(), body(ChatBody, **other))).status == 404


def test_responses_adapter_names_its_own_fields():
    req = msgspec.convert(
        {
            "input": "hi",
            "max_output_tokens": 5,
            "text": {"format": {"type": "json_object"}},
            "reasoning": {"effort": "high"},
        },
        ResponsesRequest,
    )
    chat = responses_chat(req, "m", HI)
    assert (chat.max_tokens, chat.constraint_param, chat.reasoning_effort) == (
        5,
        "text.format",
        "high",
    )
    assert chat.names("messages") == "input"
    assert refused(lambda: responses_chat(req, "m", [])).param == "input"
    tools = [{"type": "function", "name": "f"}]
    choice = msgspec.convert({"input": "hi", "tools": tools, "tool_choice": "x"}, ResponsesRequest)
    assert refused(lambda: responses_chat(choice, "m", HI)).param == "tool_choice"


# ---- the core names the dialect's field ------------------------------------------------------


def test_sampling_params_name_the_dialects_field():
    names = ParamNames({"repetition_penalty": "repeat_penalty"})
    err = refused(
        lambda: sampling_params(Sampling(repetition_penalty=20.0), 4, None, 64, 0, None, names)
    )
    assert err.param == "repeat_penalty" and err.message.startswith("'repeat_penalty' ")


def test_a_template_failure_names_the_dialects_messages_field():
    def broken(*args: Any, **kwargs: Any) -> str:
        raise ValueError("no")

    req = msgspec.convert({"input": "hi"}, ResponsesRequest)
    chat = responses_chat(req, "m", HI)
    tokenizer = SimpleNamespace(apply_chat_template=broken)
    err = refused(lambda: chat_text(manager(tokenizer=tokenizer, injects_tools=False), chat))
    assert err.param == "input"


def test_a_forced_tool_choice_without_a_parser_names_tool_choice():
    tools = [{"type": "function", "function": {"name": "f"}}]
    chat = ChatRequest("m", HI, tools=tools, tool_choice="required")
    assert refused(lambda: tool_setup(manager(), chat, "")).param == "tool_choice"


def test_one_served_model_check_in_each_dialects_words():
    assert served_model(manager(), None) == served_model(manager(), "alias") == "m"
    assert served_model(manager(), "alias:latest", latest_ok=True) == "m"
    assert "not found" in refused(lambda: served_model(manager(), "x")).message
    openai = refused(lambda: served_model(manager(), "x", openai_not_found))
    assert (openai.status, openai.param, openai.code) == (404, "model", "model_not_found")
    assert refused(lambda: served_model(manager(), "alias:latest")).status == 404


# ---- one parser-event switch -----------------------------------------------------------------


def test_split_merges_and_runs_keep_the_outputs_order():
    call0, call1 = ToolCallDelta(0, "c0", "f", "{}"), ToolCallDelta(1, "c1", "g", "{}")
    events = [ReasoningContentDelta("r"), ContentDelta("a"), ContentDelta("b"), call0]
    merged = split(events)
    assert (merged.reasoning, merged.content, merged.calls) == ("r", "ab", [call0])
    assert split([ContentDelta("")]).content == ""  # an event without text still counts
    order = runs([call0, ContentDelta("x"), call1, ReasoningContentDelta("y")])
    assert [(r.reasoning, r.content, r.calls) for r in order] == [
        (None, None, [call0]),
        (None, "x", [call1]),
        ("y", None, []),
    ]


def test_the_stream_parser_parses_each_choice_on_its_own():
    spec = ChatOutputSpec(None, "qwen3", None)
    job = SimpleNamespace(output=spec, choices=[SimpleNamespace(index=0), SimpleNamespace(index=1)])
    batches = [
        [Delta(0, "<think>a"), Delta(1, "plain")],
        [Delta(0, "</think>b", finish_reason="stop")],
    ]

    async def deltas():
        for batch in batches:
            yield batch

    job.deltas = deltas
    stream = ParsedStream(job)

    async def collect() -> dict[int, list[Any]]:
        out: dict[int, list[Any]] = {0: [], 1: []}
        async for part in stream.deltas():
            assert not isinstance(part, APIError)
            for d in part:
                out[d.index].append(split(d.events))
        return out

    got = asyncio.run(collect())
    assert "".join(s.reasoning or "" for s in got[0]) == "a"
    assert "".join(s.content or "" for s in got[0]) == "b"
    assert "".join(s.content or "" for s in got[1]) == "plain"
    assert stream.finish == "stop"
