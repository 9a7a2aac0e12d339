"""The XML-style tool-call dialects (qwen3-coder, glm45, minimax-m2).

1. Round trips through the models' own chat templates: an assistant turn with content,
   reasoning and 0, 1 or 2 calls comes back exactly, read whole and streamed in any split.
2. The forced-call grammars accept what the templates write and nothing off-schema.
3. Edge cases of reading a block: malformed or cut-off blocks, unknown names, content around
   the calls, values that contain the format's own characters.
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from template_turns import (
    CALLS,
    CONVERSATION,
    TOOLS,
    Turn,
    assert_round_trip,
    assistant_message,
    read_streamed,
    read_whole,
    requires_templates,
    template,
    turn_text,
)

from localradix.loader.chat_template import render_chat_template
from localradix.parsers.events import ContentDelta, ToolCallDelta
from localradix.parsers.reasoning import detect_reasoning_parser, get_reasoning_parser
from localradix.parsers.tool_calls import (
    ToolCallStreamParser,
    detect_tool_parser,
    get_tool_parser,
)
from localradix.parsers.tool_constraint import tool_call_constraint
from localradix.sampling_params import Constraint

# template -> its dialect and the text that ends its assistant turn (None: the template writes
# nothing after a final assistant turn, as GLM's, whose model ends it with a stop token).
TEMPLATES: dict[str, tuple[str, str | None]] = {
    "Qwen3-Coder": ("qwen3-coder", "<|im_end|>"),
    "Qwen3.5-4B": ("qwen3-coder", "<|im_end|>"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("qwen3-coder", "<|im_end|>"),
    "StepFun3.5-Flash": ("qwen3-coder", "<|im_end|>"),
    "GLM-4.6": ("glm45", None),
    "GLM-4.7-Flash": ("glm45", None),
    "MiniMax-M2": ("minimax-m2", "[e~["),
}
NO_REASONING = {"Qwen3-Coder"}  # its template does not render reasoning_content
CONTENT = "Let me check both.\nOne moment."
REASONING = "The user wants two things.\nI will call the tools."
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
DIALECTS = ["qwen3-coder", "glm45", "minimax-m2"]


def turn(name: str, message: dict[str, Any], tools: Any = TOOLS, **kwargs: Any) -> Turn:
    """`turn_text`, also for templates that write no end marker after a final turn (there
    the turn runs to the end of the render)."""
    end = TEMPLATES[name][1]
    if end is not None:
        return turn_text(name, message, end, tools, **kwargs)
    common = dict(tools=tools, bos_token="<s>", eos_token="</s>", **kwargs)
    source = template(name)
    prompt = render_chat_template(
        source, messages=CONVERSATION, add_generation_prompt=True, **common
    )
    full = render_chat_template(
        source, messages=[*CONVERSATION, message], add_generation_prompt=False, **common
    )
    shared = len(os.path.commonprefix([prompt, full]))
    return Turn(prompt[:shared], full[shared:])


def calls_only(name: str, calls: Any, tools: Any = TOOLS, **kwargs: Any) -> Turn:
    """A turn of calls alone, thinking off (what a forced response is)."""
    return turn(name, assistant_message("", None, calls), tools, enable_thinking=False, **kwargs)


def schemas(tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {t["function"]["name"]: t["function"]["parameters"] for t in tools}


def reasoning_parser(name: str) -> str | None:
    return detect_reasoning_parser(template(name))


# ---- 1. round trips through the templates ----------------------------------------------------


@cache
def round_trip_case(name: str, n_calls: int, content: str) -> tuple[Turn, str | None]:
    reasoning = None if name in NO_REASONING else REASONING
    message = assistant_message(content, reasoning, CALLS[:n_calls])
    return turn(name, message, enable_thinking=True), reasoning


CASES = [
    (name, n, content)
    for name in TEMPLATES
    for n in (0, 1, 2)
    for content in (CONTENT, "")
    if n or content
]


@requires_templates
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_templates_are_detected_as_their_dialect(name: str) -> None:
    assert detect_tool_parser(template(name)) == TEMPLATES[name][0]


@requires_templates
@pytest.mark.parametrize(("name", "n_calls", "content"), CASES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(0, 400)))
def test_template_turn_round_trips(name: str, n_calls: int, content: str, cuts: list[int]) -> None:
    text, reasoning = round_trip_case(name, n_calls, content)
    dialect, reasoner = TEMPLATES[name][0], reasoning_parser(name)
    calls = CALLS[:n_calls]
    assert_round_trip(read_whole(text, dialect, reasoner), content, reasoning, calls)
    assert_round_trip(read_streamed(text, cuts, dialect, reasoner), content, reasoning, calls)


@requires_templates
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_call_without_arguments_round_trips(name: str) -> None:
    tools = [*TOOLS, TIME]
    text = calls_only(name, [("get_time", {})], tools)
    read = read_whole(text, TEMPLATES[name][0], reasoning_parser(name), tools)
    assert read.calls == [("get_time", {})]
    assert read.content.strip() == ""


# ---- 2. forced calls -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiler() -> Any:
    xgr = pytest.importorskip("xgrammar")
    return xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


def accepts(compiler: Any, constraint: Constraint | None, text: str) -> bool:
    """As the engine compiles it (`test_tool_constraint.accepts`)."""
    import xgrammar as xgr

    from localradix.constrained.grammar import _COMPILERS

    assert constraint is not None
    compiled = _COMPILERS[constraint.kind](compiler, constraint.spec)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())


def forced(
    name: str, tool_choice: Any, prompt: str, parallel: bool = True, tools: Any = TOOLS
) -> Constraint | None:
    """The constraint the server builds for this template: its dialect, its reasoning block
    (required when the prompt opened it)."""
    reasoner = reasoning_parser(name)
    opens = reasoner is not None and get_reasoning_parser(reasoner).prompt_opens_reasoning(prompt)
    return tool_call_constraint(
        tools,
        tool_choice,
        TEMPLATES[name][0],
        parallel,
        reasoning=reasoner,
        starts_in_reasoning=opens,
    )


@requires_templates
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_required_accepts_the_templates_calls(compiler: Any, name: str) -> None:
    dialect = TEMPLATES[name][0]
    text = calls_only(name, CALLS)
    if name != "StepFun3.5-Flash":  # StepFun's prompt leaves the reasoning block open
        plain = tool_call_constraint(TOOLS, "required", dialect, True)
        assert accepts(compiler, plain, text.text), text.text
    assert accepts(compiler, forced(name, "required", text.prompt), text.text), text.text
    tools = [*TOOLS, TIME]
    no_args = calls_only(name, [("get_time", {}), CALLS[0]], tools)
    assert accepts(compiler, forced(name, "required", no_args.prompt, tools=tools), no_args.text)


@requires_templates
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_required_rejects_unknown_names_and_bad_arguments(compiler: Any, name: str) -> None:
    text = calls_only(name, CALLS)
    constraint = forced(name, "required", text.prompt)
    assert not accepts(compiler, constraint, text.text.replace("get_weather", "get_wether"))
    bad = [
        {"days": 3},  # the required city missing
        {"city": "Paris", "days": "three"},
        {"city": "Paris", "days": 2.5},
        {"city": "Paris", "units": "K"},
        {"city": "Paris", "wind": 4},  # not in the schema
    ]
    for arguments in bad:
        wrong = calls_only(name, [("get_weather", arguments)])
        assert not accepts(compiler, constraint, wrong.text), wrong.text
    flag = calls_only(name, [("search_files", {"query": "x", "exact": "maybe"})])
    assert not accepts(compiler, constraint, flag.text), flag.text


@requires_templates
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_not_parallel_means_one_call(compiler: Any, name: str) -> None:
    one, two = calls_only(name, CALLS[:1]), calls_only(name, CALLS)
    assert accepts(compiler, forced(name, "required", one.prompt, parallel=False), one.text)
    assert not accepts(compiler, forced(name, "required", two.prompt, parallel=False), two.text)


@requires_templates
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_named_choice_forces_that_function(compiler: Any, name: str) -> None:
    search, weather = calls_only(name, CALLS[1:]), calls_only(name, CALLS[:1])
    choice = {"type": "function", "function": {"name": "search_files"}}
    constraint = forced(name, choice, search.prompt)
    assert accepts(compiler, constraint, search.text)
    assert not accepts(compiler, constraint, weather.text)
    assert not accepts(compiler, constraint, calls_only(name, CALLS[1:] * 2).text)


@requires_templates
@pytest.mark.parametrize(
    "name",
    [name for name in TEMPLATES if name not in NO_REASONING],
)
def test_required_after_reasoning(compiler: Any, name: str) -> None:
    """With thinking on, the calls follow the reasoning block (which the prompt opens, in all
    but GLM-4.6's template, which writes "\n<think>" itself)."""
    text = turn(name, assistant_message("", REASONING, CALLS), enable_thinking=True)
    assert accepts(compiler, forced(name, "required", text.prompt), text.text), text.text


def test_qwen_grammar_writes_booleans_as_the_template_does(compiler: Any) -> None:
    """Jinja's `string` writes True / False / None; nested values are JSON."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "flag": {"type": "boolean"},
                        "maybe": {"type": ["integer", "null"]},
                        "nested": {"type": "object", "properties": {"b": {"type": "boolean"}}},
                    },
                },
            },
        }
    ]
    constraint = tool_call_constraint(tools, "required", "qwen3-coder", True)

    def call(flag: str, maybe: str) -> str:
        return (
            f"<tool_call>\n<function=f>\n<parameter=flag>\n{flag}\n</parameter>\n"
            f"<parameter=maybe>\n{maybe}\n</parameter>\n"
            '<parameter=nested>\n{"b": true}\n</parameter>\n</function>\n</tool_call>'
        )

    assert accepts(compiler, constraint, call("True", "None"))
    assert accepts(compiler, constraint, call("False", "7"))
    assert not accepts(compiler, constraint, call("true", "7"))
    parsed = get_tool_parser("qwen3-coder").parse(call("True", "None"), tool_schemas=schemas(tools))
    assert [json.loads(c.arguments) for c in parsed.calls] == [
        {"flag": True, "maybe": None, "nested": {"b": True}}
    ]


# ---- 3. edge cases ---------------------------------------------------------------------------


def qwen(name: str, **values: str) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def glm(name: str, **values: str) -> str:
    pairs = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in values.items())
    return f"<tool_call>{name}{pairs}</tool_call>"


def minimax(name: str, **values: str) -> str:
    params = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in values.items())
    return f'<minimax:tool_call>\n<invoke name="{name}">\n{params}</invoke>\n</minimax:tool_call>'


WIRE = {"qwen3-coder": qwen, "glm45": glm, "minimax-m2": minimax}
MALFORMED = {
    "qwen3-coder": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
        "<tool_call>\n<function=get_weather\n</function>\n</tool_call>",
        "<tool_call>\n</tool_call>",
        qwen("get_weather", city="Paris")[:-12] + "tail</tool_call>",
    ],
    "glm45": [
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        "<tool_call>get_weather<arg_key>city</arg_key>Paris</tool_call>",
        "<tool_call>get_weather<arg_key>city<arg_value>Paris</arg_value></tool_call>",
        "<tool_call>get weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</tool_call>",
        "<tool_call></tool_call>",
    ],
    "minimax-m2": [
        "<minimax:tool_call>\n</minimax:tool_call>",
        '<minimax:tool_call>\n<invoke name="get_weather">\n</minimax:tool_call>',
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
        "</invoke>\n</minimax:tool_call>",
        '<minimax:tool_call>\n<invoke name="get_weather">\n</invoke>\nstray\n</minimax:tool_call>',
        '<minimax:tool_call>\n{"name": "get_weather"}\n</minimax:tool_call>',
    ],
}
SCHEMAS = schemas(TOOLS)


def stream(
    dialect: str, text: str, cuts: list[int], **kwargs: Any
) -> tuple[str, list[tuple[str, Any]]]:
    """Content and (name, arguments) of `text` fed in pieces cut at `cuts`."""
    parser: ToolCallStreamParser = get_tool_parser(dialect)(tool_schemas=SCHEMAS, **kwargs)
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    events = [e for a, b in zip(bounds, bounds[1:]) for e in parser.feed(text[a:b])]
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ToolCallDelta):
            call = calls.setdefault(event.index, ["", ""])
            call[0] += event.name or ""
            call[1] += event.arguments or ""
    return content, [(n, json.loads(a)) for n, a in calls.values()]


def whole(dialect: str, text: str, **kwargs: Any) -> tuple[str, list[tuple[str, Any]]]:
    parsed = get_tool_parser(dialect).parse(text, tool_schemas=SCHEMAS, **kwargs)
    return parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def every_split(dialect: str, text: str, **kwargs: Any) -> tuple[str, list[tuple[str, Any]]]:
    """What `text` reads as, checked to be the same whole, streamed at once and streamed with
    a cut at every offset (and at every pair of neighbouring offsets)."""
    expected = whole(dialect, text, **kwargs)
    assert stream(dialect, text, [], **kwargs) == expected
    for i in range(1, len(text)):
        assert stream(dialect, text, [i, i + 1], **kwargs) == expected, i
    return expected


@pytest.mark.parametrize("dialect", DIALECTS)
def test_malformed_blocks_stay_content(dialect: str) -> None:
    for text in MALFORMED[dialect]:
        for complete in (False, True):
            assert every_split(dialect, text, complete_calls=complete) == (text, []), text
        framed = f"Before {text} after"
        assert every_split(dialect, framed) == (framed, [])


@pytest.mark.parametrize("dialect", DIALECTS)
def test_cut_off_block_is_dropped_with_complete_calls(dialect: str) -> None:
    block = WIRE[dialect]("get_weather", city="Paris", days="3")
    for n in range(1, len(block)):
        text = "Checking. " + block[:n]
        content, calls = whole(dialect, text, complete_calls=True)
        assert (content.strip(), calls) == ("Checking.", []), n
        assert stream(dialect, text, [n], complete_calls=True) == (content, calls)
        assert whole(dialect, text) == (text, [])  # without complete_calls it stays content
    assert whole(dialect, "Checking. " + block, complete_calls=True)[1] == [
        ("get_weather", {"city": "Paris", "days": 3})
    ]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_names_not_in_tools_stay_content(dialect: str) -> None:
    block = WIRE[dialect]("get_weather", city="Paris")
    for complete in (False, True):
        got = every_split(dialect, block, tool_names=["search_files"], complete_calls=complete)
        assert got == (block, [])
    other = WIRE[dialect]("search_files", query="x")
    content, calls = every_split(dialect, block + other, tool_names=["search_files"])
    assert content == block and calls == [("search_files", {"query": "x"})]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_content_before_and_between_calls(dialect: str) -> None:
    write = WIRE[dialect]
    text = (
        "First the weather.\n"
        + write("get_weather", city="Paris")
        + "\nThen the search.\n"
        + write("search_files", query="café", exact="true")
        + "\n"
    )
    content, calls = every_split(dialect, text, complete_calls=True)
    assert content == "First the weather.Then the search."
    assert calls == [
        ("get_weather", {"city": "Paris"}),
        ("search_files", {"query": "café", "exact": True}),
    ]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_values_holding_the_formats_own_characters(dialect: str) -> None:
    close = {"glm45": "</arg_value>"}.get(dialect, "</parameter>")
    filters = {"note": f"a {close} b", "html": "<b>x</b>", "lines": "1\n2"}
    values = {
        "query": f"if a < b and c > d: print('{close}')\n    return <x>",
        "filters": json.dumps(filters),
        "paths": '["a\\nb", "<c>"]',
    }
    text = WIRE[dialect]("search_files", **values)
    content, calls = every_split(dialect, text)
    assert content == ""
    assert calls == [
        ("search_files", {"query": values["query"], "filters": filters, "paths": ["a\nb", "<c>"]})
    ]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_whitespace_around_a_fixed_choice_is_not_part_of_it(dialect: str) -> None:
    """The XML grammars allow whitespace around any value that is not free text."""
    text = WIRE[dialect]("get_weather", city=" Paris ", units="\n\t F \r\n", days=" 3\n")
    assert whole(dialect, text)[1] == [
        ("get_weather", {"city": " Paris ", "units": "F", "days": 3})
    ]


def test_qwen_value_newlines_only_the_templates_are_stripped() -> None:
    text = qwen("search_files", query="\n  indented\n", limit="\n2\n")
    assert whole("qwen3-coder", text)[1] == [
        ("search_files", {"query": "\n  indented\n", "limit": 2})
    ]
    # Without the template's newlines, nothing is stripped.
    bare = "<tool_call>\n<function=f>\n<parameter=q>x</parameter>\n</function>\n</tool_call>"
    assert whole("qwen3-coder", bare)[1] == [("f", {"q": "x"})]


def test_minimax_block_holds_several_calls() -> None:
    text = (
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Rome'
        '</parameter>\n</invoke>\n<invoke name="search_files">\n<parameter name="limit">2'
        "</parameter>\n</invoke>\n</minimax:tool_call>"
    )
    assert every_split("minimax-m2", text) == (
        "",
        [("get_weather", {"city": "Rome"}), ("search_files", {"limit": 2})],
    )


def test_special_markers() -> None:
    """The wire tokens a detokenizer must keep (harmless where they are plain text)."""
    assert get_tool_parser("qwen3-coder").special_markers == ("<tool_call>", "</tool_call>")
    assert "<arg_value>" in get_tool_parser("glm45").special_markers
    assert get_tool_parser("minimax-m2").special_markers == (
        "<minimax:tool_call>",
        "</minimax:tool_call>",
    )
