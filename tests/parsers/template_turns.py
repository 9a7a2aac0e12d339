"""The round trip through a model's own chat template: render an assistant turn holding content,
reasoning and tool calls with the family's real template (llama.cpp ships them), take the text
the template writes for that turn (what the model generates), and read it back with our parsers,
whole and streamed in any split. The template is the reference for how the model writes.

Used by the dialects' tests: `turn_text` renders, `read_whole` / `read_streamed` parse, and
`assert_round_trip` checks both against the message.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from localradix.loader.chat_template import render_chat_template
from localradix.parsers.events import ContentDelta, ReasoningContentDelta, ToolCallDelta
from localradix.parsers.output_parser import ChatOutputParser, parse_chat_output
from localradix.parsers.reasoning import get_reasoning_parser

TESTS = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("_localradix_llama_sdist", TESTS / "llama_sdist.py")
assert _spec is not None and _spec.loader is not None
llama_sdist = sys.modules.get(_spec.name) or importlib.util.module_from_spec(_spec)
if _spec.name not in sys.modules:
    sys.modules[_spec.name] = llama_sdist
    _spec.loader.exec_module(llama_sdist)

requires_templates = pytest.mark.skipif(
    llama_sdist.llama_version() is None, reason="llama-cpp-python is not installed"
)

# Arguments that exercise every value kind: strings with quotes, unicode and newlines, numbers,
# booleans, null, nested objects and arrays.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "units": {"type": "string", "enum": ["C", "F"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_files",
        "description": "Search a repository",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "number"},
                "exact": {"type": "boolean"},
                "filters": {"type": "object"},
                "paths": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]
CALLS = [
    ("get_weather", {"city": 'Paris "Rive Gauche"', "days": 3}),
    (
        "search_files",
        {
            "query": "naïve café 東京 → def f(x): return {'a': 1}",
            "limit": 2.5,
            "exact": True,
            "filters": {"lang": ["py", "rs"], "depth": {"max": 4}, "skip": None},
            "paths": ["src/a.py", "b\\c"],
        },
    ),
]


@cache
def template(name: str) -> str:
    """The source of llama.cpp's `models/templates/<name>.jinja`."""
    folder = llama_sdist.llama_cpp_tree() / "models" / "templates"
    return (folder / f"{name}.jinja").read_text(encoding="utf-8")


def assistant_message(
    content: str, reasoning: str | None, calls: Sequence[tuple[str, dict[str, Any]]]
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    return message


CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Find the weather and search the repo."},
]


@dataclass(frozen=True)
class Turn:
    prompt: str  # the rendered prompt, generation prompt included
    text: str  # what the template writes for the assistant turn after it, up to its end marker


def turn_text(
    name: str,
    message: dict[str, Any],
    end: str | Sequence[str],
    tools: list[dict[str, Any]] | None = TOOLS,
    **kwargs: Any,
) -> Turn:
    """Render CONVERSATION + `message` with template `name`; the turn is the text after the
    generation prompt, cut at the first of `end` (the end-of-turn text, which the model writes
    as its stop token). Where the template writes the generation prompt differently from a
    finished turn (an empty thinking block when thinking is off), the turn starts where the two
    renders part, and so does the returned prompt."""
    source = template(name)
    common = dict(tools=tools, bos_token="<s>", eos_token="</s>", **kwargs)
    prompt = render_chat_template(
        source, messages=CONVERSATION, add_generation_prompt=True, **common
    )
    full = render_chat_template(
        source, messages=[*CONVERSATION, message], add_generation_prompt=False, **common
    )
    shared = 0
    while shared < min(len(prompt), len(full)) and prompt[shared] == full[shared]:
        shared += 1
    text = full[shared:]
    ends = [end] if isinstance(end, str) else list(end)
    cuts = [i for i in (text.find(e) for e in ends) if i >= 0]
    assert cuts, f"no end marker {ends} in the turn {text!r}"
    return Turn(prompt[:shared], text[: min(cuts)])


@dataclass(frozen=True)
class Read:
    reasoning: str | None
    content: str
    calls: list[tuple[str, Any]]  # (name, arguments parsed from JSON)


def _schemas(tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {t["function"]["name"]: t["function"].get("parameters") for t in tools or ()}


def _parser_kwargs(
    turn: Turn, tool_parser: str | None, reasoning_parser: str | None, tools: Any
) -> dict[str, Any]:
    starts = None
    if reasoning_parser is not None:
        starts = get_reasoning_parser(reasoning_parser).prompt_opens_reasoning(turn.prompt)
    names = [t["function"]["name"] for t in tools or ()] if tool_parser else None
    return dict(
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        starts_in_reasoning=starts,
        tool_names=names,
        tool_schemas=_schemas(tools),
        complete_calls=True,
    )


def read_whole(
    turn: Turn, tool_parser: str | None, reasoning_parser: str | None, tools: Any = TOOLS
) -> Read:
    parsed = parse_chat_output(
        turn.text, **_parser_kwargs(turn, tool_parser, reasoning_parser, tools)
    )
    calls = [(c.name, json.loads(c.arguments)) for c in parsed.calls]
    return Read(parsed.reasoning, parsed.content, calls)


def read_streamed(
    turn: Turn,
    cuts: Sequence[int],
    tool_parser: str | None,
    reasoning_parser: str | None,
    tools: Any = TOOLS,
) -> Read:
    """The turn fed in pieces cut at `cuts` (any offsets); every call arrives whole, once."""
    parser = ChatOutputParser(**_parser_kwargs(turn, tool_parser, reasoning_parser, tools))
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(turn.text)}), len(turn.text)]
    events = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        events.extend(parser.feed(turn.text[a:b]))
    events.extend(parser.finish())
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[tuple[str, Any]] = []
    for event in events:
        if isinstance(event, ReasoningContentDelta):
            reasoning.append(event.text)
        elif isinstance(event, ContentDelta):
            content.append(event.text)
        else:
            assert isinstance(event, ToolCallDelta) and event.id and event.name
            assert event.index == len(calls)
            calls.append((event.name, json.loads(event.arguments)))
    return Read("".join(reasoning) if reasoning else None, "".join(content), calls)


def assert_round_trip(
    read: Read,
    content: str,
    reasoning: str | None,
    calls: Sequence[tuple[str, dict[str, Any]]],
) -> None:
    """What was read is what the message held: content and reasoning up to surrounding
    whitespace (templates add newlines), the calls exactly."""
    assert read.calls == [(n, a) for n, a in calls]
    assert read.content.strip() == content.strip()
    if reasoning is None:
        assert not (read.reasoning or "").strip()
    else:
        assert (read.reasoning or "").strip() == reasoning.strip()
