"""Reasoning and tool calls together, as the server runs them."""

from __future__ import annotations

import json

import pytest

from localradix.parsers.events import ContentDelta
from localradix.parsers.output_parser import (
    ChatDelta,
    ChatOutputParser,
    ReasoningContentDelta,
    parse_chat_output,
)

QWEN3 = (
    "<think>\nThe user wants the weather; I should call <tool_call> for it.\n</think>\n\n"
    "I'll look it up.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
R1 = 'Need a lookup.\n</think>\n\n[{"x": 1}] <tool_call>{"name": "f", "arguments": {}}</tool_call>'


Streamed = tuple[str | None, str, list[tuple[str, str]]]


def run(chunks: list[str], **kwargs: object) -> Streamed:
    parser = ChatOutputParser(**kwargs)  # type: ignore[arg-type]
    deltas: list[ChatDelta] = []
    for chunk in chunks:
        deltas.extend(parser.feed(chunk))
    deltas.extend(parser.finish())
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[list[str]] = []
    for delta in deltas:
        if isinstance(delta, ReasoningContentDelta):
            assert not content and not calls, "reasoning comes first"
            reasoning.append(delta.text)
        elif isinstance(delta, ContentDelta):
            content.append(delta.text)
        else:
            if delta.id is not None:
                calls.append([str(delta.name), ""])
            calls[-1][1] += delta.arguments
    joined = "".join(reasoning) if reasoning else None
    return joined, "".join(content), [(name, args) for name, args in calls]


@pytest.mark.parametrize(
    ("text", "kwargs", "reasoning", "content", "calls"),
    [
        (
            QWEN3,
            {"tool_parser": "hermes", "reasoning_parser": "qwen3"},
            "The user wants the weather; I should call <tool_call> for it.",
            "I'll look it up.",
            [("get_weather", {"city": "Paris"})],
        ),
        (
            R1,
            {
                "tool_parser": "hermes",
                "reasoning_parser": "deepseek-r1",
                "starts_in_reasoning": True,
            },
            "Need a lookup.",
            '[{"x": 1}]',
            [("f", {})],
        ),
        (
            QWEN3,
            {"reasoning_parser": "qwen3"},
            "The user wants the weather; I should call <tool_call> for it.",
            QWEN3[QWEN3.index("I'll") :],
            [],
        ),
        ("plain text", {}, None, "plain text", []),
    ],
)
def test_stream_matches_parse_at_every_split(
    text: str,
    kwargs: dict[str, object],
    reasoning: str | None,
    content: str,
    calls: list[tuple[str, object]],
) -> None:
    parsed = parse_chat_output(text, **kwargs)  # type: ignore[arg-type]
    assert (parsed.reasoning, parsed.content) == (reasoning, content)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    expected = [(c.name, c.arguments) for c in parsed.calls]
    for i in range(len(text) + 1):
        assert run([text[:i], text[i:]], **kwargs) == (reasoning or None, content, expected)
    assert run(list(text), **kwargs) == (reasoning or None, content, expected)
