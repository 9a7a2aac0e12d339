"""Tool-choice constraints: compiled with xgrammar as the engine compiles them; valid wire strings
accepted, invalid ones rejected, and random constrained generations always parse into calls whose
arguments match their schemas."""

from __future__ import annotations

import json
import random
import string
from typing import Any

import numpy as np
import pytest

from localradix.constrained.grammar import _COMPILERS, GrammarState
from localradix.parsers.tool_calls import get_tool_parser
from localradix.parsers.tool_constraint import ToolChoiceError, tool_call_constraint
from localradix.sampling_params import Constraint

xgr = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city"],
}
SEARCH = {
    "type": "object",
    "properties": {
        "q": {"type": "string", "maxLength": 5},
        "filters": {
            "type": "object",
            "properties": {
                "safe": {"type": "boolean"},
                "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 2},
            },
            "required": ["safe"],
        },
    },
    "required": ["q", "filters"],
    "$defs": {"tag": {"enum": ["news", "web"]}},
}
OPTIONAL = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}},
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "search", "parameters": SEARCH}},
    {"type": "function", "function": {"name": "get_time"}},
    {"type": "function", "function": {"name": "opt", "parameters": OPTIONAL}},
]
SCHEMAS = {
    "get_weather": WEATHER,
    "search": SEARCH,
    "get_time": {"type": "object", "properties": {}, "additionalProperties": False},
    "opt": OPTIONAL,
}
DIALECTS = ["hermes", "llama3", "mistral", "mistral-v11", "pythonic"]
PARSER = {"mistral-v11": "mistral"}


@pytest.fixture(scope="module")
def string_compiler() -> Any:
    return xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


def accepts(compiler: Any, constraint: Constraint, text: str) -> bool:
    compiled = _COMPILERS[constraint.kind](compiler, constraint.spec)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())


# (dialect, [accepted under "required" + parallel], [rejected])
WIRE: list[tuple[str, list[str], list[str]]] = [
    (
        "hermes",
        [
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n'
            '{"name": "search", "arguments": {"q": "x", "filters": {"safe": true, "tags": ["web"]}}}\n</tool_call>',
            '<tool_call>\n{"name": "get_weather", "arguments": {\n  "city": "Rome",\n  "days": 3\n}}\n</tool_call>',
        ],
        [
            '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',  # required key missing
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "x": 1}}\n</tool_call>',
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 99}}\n</tool_call>',
            '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>',
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call> and text',
            "Sure, calling it.",
            "",
        ],
    ),
    (
        "llama3",
        [
            '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}',
            '{"name": "get_time", "parameters": {}}; {"name": "opt", "parameters": {"b": false}}',
        ],
        [
            '{"name": "get_weather", "parameters": {"unit": "k", "city": "x"}}',
            '<|python_tag|>{"name": "get_time", "parameters": {}}',
        ],
    ),
    (
        "mistral",
        [
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
            '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "opt", "arguments": {"a": 1}}]',
        ],
        ["[TOOL_CALLS][]", '[TOOL_CALLS]{"name": "get_time", "arguments": {}}'],
    ),
    (
        "mistral-v11",
        [
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
            "[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]opt[ARGS]{}",
        ],
        ["[TOOL_CALLS]get_weather[ARGS]{}", "[TOOL_CALLS]nope[ARGS]{}"],
    ),
    (
        "pythonic",
        [
            '[get_weather(city="Paris")]',
            '[get_weather(city="Paris", days=2, unit="f"), get_time(), opt(), opt(b=true), opt(a=1, b=false)]',
            '[search(q="x", filters={"safe": false})]',
        ],
        [
            "[get_weather()]",
            "[opt(b=true, a=1)]",
            "[opt(, a=1)]",
            '[get_weather(city="Paris"),]',
            "[]",
        ],
    ),
]


def _calls(dialect: str, text: str) -> list[tuple[str, Any]]:
    parsed = get_tool_parser(PARSER.get(dialect, dialect)).parse(text)
    assert parsed.content == ""
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


@pytest.mark.parametrize(("dialect", "good", "bad"), WIRE, ids=[w[0] for w in WIRE])
def test_required_accepts_wire_format_and_parses_back(
    string_compiler: Any, dialect: str, good: list[str], bad: list[str]
) -> None:
    constraint = tool_call_constraint(TOOLS, "required", dialect, parallel=True)
    assert constraint is not None and constraint.kind == "structural_tag"
    for text in good:
        assert accepts(string_compiler, constraint, text), text
        calls = _calls(dialect, text)
        assert calls
        for name, arguments in calls:
            jsonschema.validate(arguments, SCHEMAS[name])
    for text in bad:
        assert not accepts(string_compiler, constraint, text), text


@pytest.mark.parametrize("dialect", DIALECTS)
def test_not_parallel_means_exactly_one_call(string_compiler: Any, dialect: str) -> None:
    constraint = tool_call_constraint(TOOLS, "required", dialect, parallel=False)
    assert constraint is not None
    one, two = WIRE[DIALECTS.index(dialect)][1][:2]
    assert accepts(string_compiler, constraint, one)
    assert not accepts(string_compiler, constraint, two)


def test_named_choice_forces_that_function(string_compiler: Any) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    constraint = tool_call_constraint(TOOLS, choice, "hermes", parallel=True)
    assert constraint is not None
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert accepts(string_compiler, constraint, weather)
    assert not accepts(string_compiler, constraint, weather + "\n" + weather)
    assert not accepts(
        string_compiler,
        constraint,
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    )


def test_reasoning_block_before_the_calls(string_compiler: Any) -> None:
    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    optional = tool_call_constraint(TOOLS, "required", "qwen3", reasoning="qwen3")
    assert optional is not None
    assert accepts(
        string_compiler, optional, "<think>\nLet me see <tool_call>.\n</think>\n\n" + call
    )
    assert accepts(string_compiler, optional, call)
    opened = tool_call_constraint(
        TOOLS, "required", "hermes", reasoning="deepseek-r1", starts_in_reasoning=True
    )
    assert opened is not None
    assert accepts(string_compiler, opened, "Hmm.\n</think>\n\n" + call)
    assert not accepts(string_compiler, opened, call)


@pytest.mark.parametrize("choice", ["auto", "none", None])
def test_unforced_choices_have_no_constraint(choice: str | None) -> None:
    assert tool_call_constraint(TOOLS, choice, "hermes", parallel=True) is None


@pytest.mark.parametrize(
    ("tools", "choice", "dialect", "message"),
    [
        (TOOLS, {"type": "function", "function": {"name": "missing"}}, "hermes", "not in tools"),
        ([], "required", "hermes", "at least one"),
        (TOOLS, "required", "klingon", "dialect"),
        (TOOLS, "sometimes", "hermes", "tool_choice must be"),
        (
            [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"properties": {"not-ident": {}}}},
                }
            ],
            "required",
            "pythonic",
            "keyword",
        ),
    ],
)
def test_errors_explain(
    tools: list[dict[str, Any]], choice: Any, dialect: str, message: str
) -> None:
    with pytest.raises(ToolChoiceError, match=message):
        tool_call_constraint(tools, choice, dialect)


def test_invalid_schema_is_reported_by_the_compiler(string_compiler: Any) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}},
            },
        }
    ]
    constraint = tool_call_constraint(tools, "required", "hermes")
    assert constraint is not None
    with pytest.raises(Exception):  # noqa: B017 - the grammar service turns it into InvalidGrammar
        _COMPILERS[constraint.kind](string_compiler, constraint.spec)


# ---- random generation through token bitmasks, as the engine decodes -------------------------

EXTRA_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    '{"name": ',
    '"arguments": ',
    "[TOOL_CALLS]",
    "[ARGS]",
    "</think>",
    "true",
    "false",
    "  ",
]
VOCAB = [*string.printable[:95], "\n", *EXTRA_TOKENS, "<eos>"]
EOS = len(VOCAB) - 1


@pytest.fixture(scope="module")
def token_compiler() -> Any:
    info = xgr.TokenizerInfo(VOCAB, stop_token_ids=[EOS])
    return xgr.GrammarCompiler(info, max_threads=1)


def generate(
    compiler: Any, constraint: Constraint, rng: random.Random, max_steps: int = 4000
) -> str | None:
    state = GrammarState(xgr.GrammarMatcher(_COMPILERS[constraint.kind](compiler, constraint.spec)))
    mask = np.zeros((1, (len(VOCAB) + 31) // 32), dtype=np.int32)
    out: list[str] = []
    for _ in range(max_steps):
        state.fill_mask(mask, 0)
        bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: len(VOCAB)]
        allowed = np.flatnonzero(bits).tolist()
        # Prefer structure over long strings so walks end: weight non-letters up.
        weights = [1.0 if VOCAB[t].isalnum() else 4.0 for t in allowed]
        token = rng.choices(allowed, weights)[0]
        if token == EOS:
            assert state.terminated or state.accept(token)
            return "".join(out)
        assert state.accept(token)
        out.append(VOCAB[token])
    return None


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "search"}}]
)
def test_random_constrained_outputs_always_parse(
    token_compiler: Any, dialect: str, choice: Any
) -> None:
    constraint = tool_call_constraint(TOOLS, choice, dialect, parallel=True)
    assert constraint is not None
    rng = random.Random(f"{dialect}-{choice}")
    done = 0
    for _ in range(12):
        text = generate(token_compiler, constraint, rng)
        if text is None:
            continue
        done += 1
        calls = _calls(dialect, text)
        assert calls, text
        for name, arguments in calls:
            jsonschema.validate(arguments, SCHEMAS[name])
            if isinstance(choice, dict):
                assert name == "search"
        # The streamed form of a constrained output is the same.
        cls = get_tool_parser(PARSER.get(dialect, dialect))
        parser = cls()
        streamed = [e for ch in text for e in parser.feed(ch)] + parser.finish()
        assert not [e for e in streamed if not hasattr(e, "index")], text
    assert done >= 6


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("parallel", [True, False])
def test_the_model_may_stop_after_any_complete_call(
    string_compiler: Any, dialect: str, parallel: bool
) -> None:
    """End of sequence is allowed right after a complete call, and after the newline a model
    writes before another one (a small model that prefers the newline can still stop)."""
    constraint = tool_call_constraint(TOOLS, "required", dialect, parallel=parallel)
    assert constraint is not None
    one, two = WIRE[DIALECTS.index(dialect)][1][:2]
    for text in (one, one + "\n"):
        assert accepts(string_compiler, constraint, text), text
    assert not accepts(string_compiler, constraint, one + "\n\n")
    assert accepts(string_compiler, constraint, two + "\n") == parallel
