"""Reasoning parsers: canned outputs, streamed split at every position, and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localradix.parsers.reasoning import (
    REASONING_PARSERS,
    ReasoningDialect,
    ReasoningSplit,
    detect_reasoning_parser,
    get_reasoning_parser,
)

# (dialect, starts_in_reasoning, output, reasoning, content)
CANNED: list[tuple[str, bool | None, str, str | None, str]] = [
    (
        "qwen3",
        None,
        "<think>\nThe user wants X.\n</think>\n\nX is 4.",
        "The user wants X.",
        "X is 4.",
    ),
    ("qwen3", None, "<think>\n\n</think>\n\nNo thinking.", "", "No thinking."),
    ("qwen3", None, "Just an answer, no <think> here.", None, "Just an answer, no <think> here."),
    (
        "qwen3",
        None,
        "  \nLeading space is content verbatim.",
        None,
        "  \nLeading space is content verbatim.",
    ),
    ("qwen3", None, "<think>Cut off in the mid", "Cut off in the mid", ""),
    (
        "qwen3",
        None,
        "<think>a < b and </thin> is not the end</think>ok",
        "a < b and </thin> is not the end",
        "ok",
    ),
    ("qwen3", None, "<thinking>not a tag</thinking>", None, "<thinking>not a tag</thinking>"),
    ("qwen3", None, "<thi", None, "<thi"),
    ("qwen3", None, "<think>one</think>two</think>", "one", "two</think>"),
    ("qwen3", False, "<think>x</think>y", "x", "y"),
    (
        "deepseek-r1",
        None,
        "Okay, so 2+2.\n</think>\n\nThe answer is 4.",
        "Okay, so 2+2.",
        "The answer is 4.",
    ),
    ("deepseek-r1", None, "<think>\nRepeated tag.\n</think>\nDone", "Repeated tag.", "Done"),
    ("deepseek-r1", None, "Still thinking when cut", "Still thinking when cut", ""),
    ("deepseek-r1", None, "", "", ""),
    ("deepseek-r1", True, "</think>Direct", "", "Direct"),
    ("qwen3", True, "reasoning\n</think>\n\n<tool_call>", "reasoning", "<tool_call>"),
    ("magistral", None, "[THINK]Let me see.[/THINK]\nHere it is.", "Let me see.", "Here it is."),
    ("magistral", None, "[THIS] is content", None, "[THIS] is content"),
]


def _id(case: tuple[object, ...]) -> str:
    return f"{case[0]}-{case[1]}-{str(case[2])[:20]!r}"


def stream(dialect: ReasoningDialect, chunks: list[str], starts: bool | None) -> tuple[str, str]:
    parser = dialect.parser(starts)
    reasoning, content = [], []
    for chunk in chunks:
        delta = parser.feed(chunk)
        reasoning.append(delta.reasoning)
        content.append(delta.content)
    tail = parser.finish()
    return "".join(reasoning) + tail.reasoning, "".join(content) + tail.content


@pytest.mark.parametrize("case", CANNED, ids=[_id(c) for c in CANNED])
def test_split_canned(case: tuple[str, bool | None, str, str | None, str]) -> None:
    name, starts, text, reasoning, content = case
    assert get_reasoning_parser(name).split(text, starts) == ReasoningSplit(reasoning, content)


@pytest.mark.parametrize("case", CANNED, ids=[_id(c) for c in CANNED])
def test_stream_matches_split_at_every_position(
    case: tuple[str, bool | None, str, str | None, str],
) -> None:
    name, starts, text, reasoning, content = case
    dialect = get_reasoning_parser(name)
    expected = ((reasoning or ""), content)
    assert stream(dialect, [text], starts) == expected
    assert stream(dialect, list(text), starts) == expected
    for i in range(len(text) + 1):
        assert stream(dialect, [text[:i], text[i:]], starts) == expected
        for j in range(i, len(text) + 1, 3):
            assert stream(dialect, [text[:i], text[i:j], text[j:]], starts) == expected


def test_deltas_arrive_early_and_tags_are_held() -> None:
    parser = get_reasoning_parser("qwen3").parser()
    assert parser.feed("<th") == ("", "")
    assert parser.feed("ink>\nStep one") == ("Step one", "")
    assert parser.feed(".\n</th") == (".", "")
    assert parser.feed("ink>\n\nAns") == ("", "Ans")
    assert parser.feed("wer") == ("", "wer")
    assert parser.finish() == ("", "")


def test_prompt_opens_reasoning() -> None:
    r1 = get_reasoning_parser("deepseek-r1")
    assert r1.prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜><think>\n")
    assert not r1.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not r1.prompt_opens_reasoning("<|im_start|>assistant\n")


def test_registry_and_detection() -> None:
    assert set(REASONING_PARSERS) >= {"deepseek-r1", "qwen3", "magistral"}
    with pytest.raises(KeyError, match="known"):
        get_reasoning_parser("nope")
    qwen3 = "{%- if '</think>' in content %}{%- set reasoning_content = ... %}<think>\\n"
    r1 = "{{'<｜Assistant｜>'}}{% if '</think>' in content %}...{{'<｜Assistant｜><think>\\n'}}"
    assert detect_reasoning_parser(qwen3) == "qwen3"
    assert detect_reasoning_parser(r1) == "deepseek-r1"
    assert detect_reasoning_parser("[SYSTEM_PROMPT]...[THINK]...[/THINK]") == "magistral"
    assert detect_reasoning_parser("{{ message.content }}") is None
    assert detect_reasoning_parser(None) is None


pieces = st.lists(
    st.sampled_from(
        ["<think>", "</think>", "<", "</", "think", ">", "\n", " ", "a", "b", "<thi", "nk>"]
    ),
    max_size=20,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(
    name=st.sampled_from(sorted(REASONING_PARSERS)),
    starts=st.sampled_from([None, True, False]),
    text=pieces,
    cuts=st.lists(st.integers(0, 200), max_size=6),
)
def test_property_stream_equals_split(
    name: str, starts: bool | None, text: str, cuts: list[int]
) -> None:
    dialect = get_reasoning_parser(name)
    if name == "magistral":
        text = text.replace("<think>", "[THINK]").replace("</think>", "[/THINK]")
    reasoning, content = dialect.split(text, starts)
    points = [0, *sorted(c for c in cuts if c <= len(text)), len(text)]
    chunks = [text[a:b] for a, b in zip(points, points[1:])]
    assert stream(dialect, chunks, starts) == (reasoning or "", content)
    # Nothing is lost but the tags and the whitespace around the reasoning.
    if reasoning is None:
        assert content == text
        return
    rest = text.lstrip(" \t\n\r")
    if rest.startswith(dialect.start):
        rest = rest[len(dialect.start) :]
    end = rest.find(dialect.end)
    if end != -1:
        rest = rest[:end] + rest[end + len(dialect.end) :]
    assert "".join((reasoning + content).split()) == "".join(rest.split())
