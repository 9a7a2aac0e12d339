"""`complete_calls` (the server's mode): each call is sent whole once complete, and a call cut
off by the end of the output (max_tokens) or broken is dropped, so the stream and parse() agree
on every output and no call markup ever leaks into the content."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tool_parsers import BROKEN, CANNED, _chunks, mutated, noise, splits

from localradix.parsers.events import ToolCallDelta
from localradix.parsers.output_parser import ChatOutputParser, parse_chat_output
from localradix.parsers.tool_calls import ToolCallStreamParser, get_tool_parser

MARKUP = ("<tool_call>", "</tool_call>", '"name"', "[TOOL_CALLS]", "<|python_tag|>")


def events_of(cls: type[ToolCallStreamParser], chunks: list[str]) -> list[Any]:
    parser = cls(complete_calls=True)
    events = [e for chunk in chunks for e in parser.feed(chunk)]
    return events + parser.finish()


def check_agrees(dialect: str, text: str, chunks: list[str]) -> None:
    """Stream == parse(); every call in one delta with valid JSON arguments."""
    cls = get_tool_parser(dialect)
    parsed = cls.parse(text, complete_calls=True)
    calls = [e for e in events_of(cls, chunks) if isinstance(e, ToolCallDelta)]
    assert all(e.id is not None for e in calls), "each call is one delta"
    for call in parsed.calls:
        json.loads(call.arguments)
    content = "".join(e.text for e in events_of(cls, chunks) if not isinstance(e, ToolCallDelta))
    assert content == parsed.content
    assert [(e.name, e.arguments) for e in calls] == [(c.name, c.arguments) for c in parsed.calls]


@pytest.mark.parametrize("case", CANNED, ids=[f"{c[0]}:{c[1][:30]!r}" for c in CANNED])
def test_well_formed_outputs_parse_as_without_the_mode(case: tuple[str, str, str, Any]) -> None:
    dialect, text = case[0], case[1]
    cls = get_tool_parser(dialect)
    plain, complete = cls.parse(text), cls.parse(text, complete_calls=True)
    # Only a marker cut off at the very end ("... <tool_ca") is dropped from the content.
    dropped = plain.content[len(complete.content) :]
    assert plain.content.startswith(complete.content)
    assert not dropped.strip() or any(m.startswith(dropped.strip()) for m in cls.markers)
    assert [(c.name, c.arguments) for c in complete.calls] == [
        (c.name, c.arguments) for c in plain.calls
    ]
    for chunks in splits(text):
        check_agrees(dialect, text, chunks)


@pytest.mark.parametrize("case", BROKEN, ids=[f"{c[0]}:{c[1][:30]!r}" for c in BROKEN])
def test_broken_calls_are_dropped_not_content(case: tuple[str, str]) -> None:
    dialect, text = case
    parsed = get_tool_parser(dialect).parse(text, complete_calls=True)
    assert parsed.calls == []
    # The call's opening is gone (a closing tag after invalid JSON may stay as text).
    assert not any(mark in parsed.content for mark in MARKUP if mark[1] != "/"), parsed.content
    for chunks in splits(text):
        check_agrees(dialect, text, chunks)


TWO_CALLS = (
    "Checking.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>"
)
# Where each call's JSON object closes: from there on the call is complete.
CALL_ENDS = [i + 2 for i in range(len(TWO_CALLS)) if TWO_CALLS.startswith("}}", i)]


@pytest.mark.parametrize("cut", range(len(TWO_CALLS) + 1))
def test_output_cut_anywhere_keeps_only_complete_calls(cut: int) -> None:
    """What max_tokens leaves of a two-call output: complete calls, never markup in content."""
    text = TWO_CALLS[:cut]
    parsed = get_tool_parser("hermes").parse(text, complete_calls=True)
    assert "Checking.".startswith(parsed.content.rstrip()), (text, parsed.content)
    assert len(parsed.calls) == sum(cut >= end for end in CALL_ENDS), text
    for call in parsed.calls:
        assert json.loads(call.arguments) == {"city": "Paris", "unit": "celsius"}
    check_agrees("hermes", text, [text])
    check_agrees("hermes", text, list(text))


def test_a_call_is_held_until_complete_then_sent_whole() -> None:
    parser = get_tool_parser("hermes")(complete_calls=True)
    assert parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"ci') == []
    (event,) = parser.feed('ty": "Paris"}}\n</tool')
    assert isinstance(event, ToolCallDelta) and event.name == "get_weather"
    assert json.loads(event.arguments) == {"city": "Paris"}
    assert parser.feed('_call>\n<tool_call>\n{"name": "get_weather", "argu') == []
    assert parser.finish() == []  # the second call was cut off: dropped


def test_chat_output_parser_passes_the_mode_through_reasoning() -> None:
    text = '<think>hm</think><tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool'
    parsed = parse_chat_output(
        text, tool_parser="hermes", reasoning_parser="qwen3", complete_calls=True
    )
    assert parsed.reasoning == "hm" and parsed.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("f", {"x": 1})]
    parser = ChatOutputParser(tool_parser="hermes", reasoning_parser="qwen3", complete_calls=True)
    events = [e for ch in text for e in parser.feed(ch)] + parser.finish()
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1})]


@pytest.mark.parametrize("dialect", ["hermes", "llama3", "mistral", "pythonic"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_property_stream_and_parse_always_agree(
    dialect: str, data: st.DataObject, cuts: list[int]
) -> None:
    text = data.draw(noise | mutated(dialect))
    check_agrees(dialect, text, _chunks(text, [c for c in cuts if c <= len(text)]))


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [('""', "{}"), ('"{\\"a\\": 1}"', '{"a": 1}'), ('"x"', None), ('"": null}', "{}")],
)
def test_arguments_given_as_a_string_must_hold_json(arguments: str, expected: str | None) -> None:
    """Found by the property test: `"arguments": ""` reached clients as an empty string, which
    no client can parse. A string's content is the arguments; one that is not JSON is no call."""
    text = f'<tool_call>\n{{"name": "f", "arguments": {arguments}}}\n</tool_call>'
    for mode in (False, True):
        parsed = get_tool_parser("hermes").parse(text, complete_calls=mode)
        assert [c.arguments for c in parsed.calls] == ([expected] if expected else [])
    for chunks in splits(text):
        check_agrees("hermes", text, chunks)
