"""The request core under every dialect, without a server: one body decoder, the OpenAI response
Structs (the keys clients get), one choice renderer for streamed and whole completions, and each
dialect's finish-reason table."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from localradix.messages import TokenLogprob
from localradix.server.anthropic.render import stop
from localradix.server.core.body import decode
from localradix.server.core.gather import Gathered
from localradix.server.core.output import ChatOutputSpec
from localradix.server.core.parsed import ParsedStream
from localradix.server.errors import APIError
from localradix.server.ollama.protocol import ChatBody
from localradix.server.ollama.request import RENAMES as OLLAMA_RENAMES
from localradix.server.openai.chat import chat_response
from localradix.server.openai.completion import CompletionChoices, completion_response
from localradix.server.openai.render import finish_reason
from localradix.server.protocol import ChatCompletionRequest, CompletionRequest
from localradix.server.tokenizer_manager import Delta

CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
USAGE = {
    "prompt_tokens": 3,
    "completion_tokens": 2,
    "total_tokens": 5,
    "prompt_tokens_details": {"cached_tokens": 1},
}


def fake_job(choices: int = 1, output: Any = None, stops: tuple[str, ...] = ()) -> Any:
    manager = SimpleNamespace(token_text=lambda t: chr(t), metrics=SimpleNamespace())
    return SimpleNamespace(
        rid="r1",
        created=7,
        start=0.0,
        manager=manager,
        output=output,
        choices=[SimpleNamespace(index=i) for i in range(choices)],
        params=SimpleNamespace(stop=stops),
        usage=lambda: USAGE,
    )


def gathered(job: Any, texts: list[str], finish: list[str | None]) -> Gathered:
    g = Gathered(job)
    g.text, g.finish = texts, finish
    return g


def as_json(struct: Any) -> Any:
    return json.loads(msgspec.json.encode(struct))


# ---- one decoder --------------------------------------------------------------------------


def test_decode_takes_integral_floats_as_ints_and_names_a_wrong_field():
    req = decode(b'{"prompt": "x", "max_tokens": 4.0, "n": 2.0}', CompletionRequest)
    assert (req.max_tokens, req.n) == (4, 2)
    with pytest.raises(APIError) as err:
        decode(b'{"prompt": "x", "max_tokens": 4.5}', CompletionRequest)
    assert err.value.status == 400 and err.value.param == "max_tokens"
    with pytest.raises(APIError) as err:
        decode(b'{"prompt": ', CompletionRequest)
    assert "not valid JSON" in err.value.message


def test_decode_words_an_error_with_the_dialects_names():
    body = b'{"model": "m", "options": {"num_predict": "x"}}'
    with pytest.raises(APIError) as err:
        decode(body, ChatBody, OLLAMA_RENAMES)
    assert err.value.param == "options.num_predict"


# ---- OpenAI bodies from the Structs ---------------------------------------------------------


def test_chat_response_keys_are_the_ones_clients_parse():
    spec = ChatOutputSpec("hermes", None, None, ("f",))
    job = fake_job(2, spec)
    body = as_json(chat_response(gathered(job, ["hi", CALL], ["length", "stop"]), "m", False))
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert (body["id"], body["object"], body["created"]) == ("chatcmpl-r1", "chat.completion", 7)
    plain, called = body["choices"]
    assert plain == {
        "index": 0,
        "message": {"role": "assistant", "content": "hi"},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert called["message"]["content"] is None  # tool calls and no text: null, as OpenAI
    assert called["finish_reason"] == "tool_calls"
    (call,) = called["message"]["tool_calls"]
    assert set(call) == {"id", "type", "function"} and call["type"] == "function"
    assert json.loads(call["function"]["arguments"]) == {"x": 1}
    assert body["usage"] == USAGE


def test_chat_logprobs_are_rendered_for_each_token():
    job = fake_job()
    g = gathered(job, ["ab"], ["stop"])
    g.logprobs = [[TokenLogprob(97, -0.5, ((97, -0.5), (98, -1.5))), TokenLogprob(98, -1e40)]]
    (entry_a, entry_b) = as_json(chat_response(g, "m", True))["choices"][0]["logprobs"]["content"]
    assert entry_a == {
        "token": "a",
        "logprob": -0.5,
        "bytes": [97],
        "top_logprobs": [
            {"token": "a", "logprob": -0.5, "bytes": [97]},
            {"token": "b", "logprob": -1.5, "bytes": [98]},
        ],
    }
    assert entry_b["logprob"] == -9999.0  # JSON has no -inf


@given(st.lists(st.text("abc", min_size=1, max_size=4), min_size=1, max_size=6), st.booleans())
def test_a_streamed_completion_adds_up_to_the_whole_one(pieces, echo):
    """Echo and logprob offsets come out the same whether a choice arrives whole or in pieces."""
    req = CompletionRequest(prompt="p", echo=echo, logprobs=0)
    lps = [[TokenLogprob(ord(c), -1.0) for c in piece] for piece in pieces]
    whole_job = fake_job()
    g = gathered(whole_job, ["".join(pieces)], ["stop"])
    g.logprobs = [[lp for piece in lps for lp in piece]]
    whole = as_json(completion_response(g, "m", req, ["PROMPT"]))["choices"][0]
    render = CompletionChoices(fake_job(), "m", req, ["PROMPT"])
    last = len(pieces) - 1
    parts = [
        as_json(render.choice(Delta(0, piece, lps[i], "stop" if i == last else None)))
        for i, piece in enumerate(pieces)
    ]
    assert "".join(p["text"] for p in parts) == whole["text"]
    assert [o for p in parts for o in p["logprobs"]["text_offset"]] == whole["logprobs"][
        "text_offset"
    ]
    assert parts[-1]["finish_reason"] == whole["finish_reason"] == "stop"


def test_completion_body_leaves_out_usage_only_in_stream_chunks():
    render = CompletionChoices(fake_job(), "m", CompletionRequest(prompt="p"), [])
    chunk = as_json(render.body([render.choice(Delta(0, "x"))]))
    assert set(chunk) == {"id", "object", "created", "model", "choices"}
    assert chunk["choices"][0] == {"index": 0, "text": "x", "logprobs": None, "finish_reason": None}


# ---- finish reasons, one table per dialect ------------------------------------------------


def test_openai_finish_reason_table():
    assert finish_reason("stop", True) == "tool_calls"
    assert finish_reason("length", True) == "length"  # a call cut off is not a call
    assert finish_reason("stop", False) == "stop"
    assert finish_reason(None, True) is None


def test_anthropic_stop_reason_table():
    job = fake_job(stops=("END",))
    job.choices[0].final = SimpleNamespace(matched_stop="END")  # the engine's decision
    assert stop(job, "length", False) == ("max_tokens", None)
    assert stop(job, "stop", True) == ("tool_use", None)
    assert stop(job, "stop", False) == ("stop_sequence", "END")
    job.choices[0].final = SimpleNamespace(matched_stop=2)  # an EOS token
    assert stop(job, "stop", False) == ("end_turn", None)
    assert stop(job, "abort", False) == ("end_turn", None)


# ---- one parsed stream for the Ollama and Anthropic renderers ------------------------------


def test_parsed_stream_splits_reasoning_content_and_calls_and_keeps_the_finish():
    spec = ChatOutputSpec("hermes", "qwen3", None, ("f",))
    text = "<think>hmm</think>ok" + CALL
    job = fake_job(output=spec)
    batches = [[Delta(0, text[i : i + 5])] for i in range(0, len(text), 5)]
    batches.append([Delta(0, "", finish_reason="stop")])

    async def deltas():
        for batch in batches:
            yield batch

    job.deltas = deltas
    stream = ParsedStream(job)

    async def collect() -> list[Any]:
        return [e for events in [x async for x in stream.events()] for e in events]

    events = asyncio.run(collect())
    kinds = {type(e).__name__ for e in events}
    assert {"ReasoningContentDelta", "ContentDelta", "ToolCallDelta"} <= kinds
    assert stream.finish == "stop"


def test_request_structs_still_decode_what_clients_send():
    req = decode(b'{"messages": [{"role": "user", "content": "hi"}]}', ChatCompletionRequest)
    assert req.messages[0].content == "hi" and req.n == 1


@pytest.mark.parametrize("given_value", [None, True, False])
def test_a_request_may_opt_out_of_speculation(given_value: bool | None) -> None:
    from localradix.server.core.sampling import sampling_of, sampling_params

    body: dict[str, Any] = {"prompt": "x"}
    if given_value is not None:
        body["speculative"] = given_value
    req = decode(json.dumps(body).encode(), CompletionRequest)
    params = sampling_params(sampling_of(req), 4, None, context=64, vocab=100)
    assert params.speculative is (given_value is not False)


THINKING_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
)


@pytest.mark.parametrize(
    ("think", "closed"), [(None, False), (True, False), (False, True), ("high", False)]
)
def test_ollama_think_reaches_the_chat_template_as_enable_thinking(think, closed) -> None:
    from localradix.loader.chat_template import render_chat_template
    from localradix.server.core.chat_template import chat_text
    from localradix.server.ollama.request import chat_request

    tokenizer = SimpleNamespace(
        apply_chat_template=lambda messages, **kw: render_chat_template(
            THINKING_TEMPLATE, messages=messages, **kw
        )
    )
    manager = SimpleNamespace(
        tokenizer=tokenizer,
        reasoning_parser=object(),
        names={"m"},
        client=SimpleNamespace(loaded=SimpleNamespace(name="m")),
    )
    body = decode(
        json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "think": think}
        ).encode(),
        ChatBody,
    )
    text = chat_text(manager, chat_request(manager, body))
    assert text.endswith("<think></think>") is closed, text


def test_chat_template_kwargs_may_not_set_what_the_server_sets() -> None:
    from localradix.server.core.chat_template import template_kwargs

    assert template_kwargs({"enable_thinking": False}) == {"enable_thinking": False}
    with pytest.raises(APIError) as err:
        template_kwargs({"messages": []})
    assert err.value.status == 400 and "messages" in err.value.message
