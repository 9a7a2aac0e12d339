"""Tools for models whose chat template has no tools section: which templates write tools
(probed on llama.cpp's real templates), the tools section and tool history the server writes for
the others, the generic dialect that reads the reply format, and its forced grammar."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from template_turns import llama_sdist, requires_templates, template

from localradix.loader.chat_template import render_chat_template
from localradix.loader.tool_prompt import (
    REPLY_FORMAT,
    ToolPrompt,
    history_as_text,
    involves_tools,
    tool_section,
)
from localradix.parsers.events import ContentDelta, ParsedToolCalls, ToolCallDelta
from localradix.parsers.generic import GenericToolParser
from localradix.parsers.tool_calls import detect_tool_parser, get_tool_parser
from localradix.parsers.tool_constraint import tool_call_constraint
from localradix.resolve import tool_parser_for

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": WEATHER_PARAMS,
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
TOOLS = [WEATHER, TIME]
NAMES = ["get_weather", "get_time"]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
}
CALL_REPLY = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
RESULTS = '{"tool_results": [{"name": "get_weather", "content": {"t": 21}}]}'
TOOL_ROUND: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"t": 21}'},
    {"role": "user", "content": "Thanks"},
]

# llama.cpp's real templates that do not write the tools they are given (measured).
NOT_NATIVE = {
    "HuggingFaceTB-SmolLM3-3B": "reads `xml_tools` / `python_tools`, which only its client sets",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "writes tool calls, never the tool list",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "writes tool calls, never the tool list",
    "deepseek-ai-DeepSeek-V3.1": "writes tool calls; its client describes the tools",
    "google-gemma-2-2b-it": "no tools, and no system role",
    "llama-cpp-rwkv-world": "no tools",
    "microsoft-Phi-3.5-mini-instruct": "no tools",
}
# ... of which these show a dialect (the deepseek-v3.1 call tokens): auto still picks generic,
# since the model would not see the tools otherwise.
NOT_NATIVE_WITH_DIALECT = {
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai-DeepSeek-V3.1",
}
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def renderer(source: str) -> Any:
    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return render_chat_template(
            source,
            messages=messages,
            tools=tools,
            add_generation_prompt=True,
            bos_token="<s>",
            eos_token="</s>",
        )

    return render


def real_templates() -> dict[str, str]:
    folder = llama_sdist.llama_cpp_tree() / "models" / "templates"
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.jinja"))}


# ---- detection -------------------------------------------------------------------------------


def test_probe_tells_templates_that_write_tools_from_those_that_do_not() -> None:
    assert ToolPrompt.probe(renderer(SMOLLM2)) == ToolPrompt(native=False, system_role=True)
    writes = "{% for t in tools or [] %}{{ t.function.name }}{% endfor %}{{ messages[-1].content }}"
    assert ToolPrompt.probe(renderer(writes)).native
    # A template refusing every probe is trusted (as before), one refusing a system message
    # has no system role.
    assert ToolPrompt.probe(renderer("{{ raise_exception('no') }}")) == ToolPrompt()
    no_system = (
        "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    assert ToolPrompt.probe(renderer(no_system)) == ToolPrompt(native=False, system_role=False)


@requires_templates
def test_real_templates_that_do_not_write_tools() -> None:
    templates = real_templates()
    probed = {name: ToolPrompt.probe(renderer(source)) for name, source in templates.items()}
    assert {n for n, p in probed.items() if not p.native} == set(NOT_NATIVE)
    assert [n for n, p in probed.items() if not p.system_role] == ["google-gemma-2-2b-it"]
    # Every template a dialect detector recognises writes tools, but DeepSeek's call tokens.
    shown = {n for n, source in templates.items() if detect_tool_parser(source)}
    assert {n for n in shown if not probed[n].native} == NOT_NATIVE_WITH_DIALECT
    for name in NOT_NATIVE:  # auto: generic, whatever dialect shows
        assert tool_parser_for("auto", templates[name], renders_tools=False) == "generic"


def test_auto_picks_generic_only_where_the_template_does_not_write_tools() -> None:
    assert tool_parser_for("auto", SMOLLM2, renders_tools=False) == "generic"
    assert tool_parser_for("auto", SMOLLM2) == "hermes"  # renders_tools unknown: as before
    assert tool_parser_for("auto", "<tool_call>", renders_tools=True) == "hermes"
    assert tool_parser_for("hermes", SMOLLM2, renders_tools=False) == "hermes"  # explicit wins
    assert tool_parser_for("generic", None) == "generic"
    assert tool_parser_for("none", SMOLLM2, renders_tools=False) is None


# ---- the injected prompt ---------------------------------------------------------------------


def test_tool_section_lists_each_schema_then_the_reply_format() -> None:
    section = tool_section(TOOLS)
    lines = section.splitlines()
    assert json.loads(lines[1]) == {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": WEATHER_PARAMS,
    }
    assert json.loads(lines[2]) == {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}},
    }
    assert section.endswith(REPLY_FORMAT)


def test_section_heads_the_first_system_message_or_is_a_new_one() -> None:
    prompt = ToolPrompt(native=False)
    merged = prompt.messages([{"role": "system", "content": "Be brief."}, *TOOL_ROUND[1:2]], TOOLS)
    assert merged[0]["content"] == tool_section(TOOLS) + "\n\nBe brief."
    new = prompt.messages(TOOL_ROUND[1:2], TOOLS)
    assert new == [{"role": "system", "content": tool_section(TOOLS)}, *TOOL_ROUND[1:2]]
    no_system = ToolPrompt(native=False, system_role=False).messages(TOOL_ROUND[1:2], TOOLS)
    assert no_system == [{"role": "user", "content": tool_section(TOOLS) + "\n\nWeather in Paris?"}]
    assert prompt.messages(TOOL_ROUND[1:2], None) == TOOL_ROUND[1:2]  # tool_choice "none"


def test_tool_history_becomes_text() -> None:
    second = {**CALL, "id": "call_2", "function": {"name": "get_time", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [CALL, second]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"t": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
        {"role": "user", "content": "And?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "name": "get_weather", "content": "[1, 2]"},
    ]
    calls = [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_time", "arguments": {}},
    ]
    results = [
        {"name": "get_weather", "content": {"t": 21}},
        {"name": "get_time", "content": "noon"},
    ]
    assert history_as_text(messages) == [
        messages[0],
        {"role": "assistant", "content": "Checking.\n\n" + json.dumps({"tool_calls": calls})},
        {"role": "user", "content": json.dumps({"tool_results": results}) + "\n\nAnd?"},
        {"role": "assistant", "content": CALL_REPLY},
        {"role": "user", "content": json.dumps({"tool_results": [{"name": "get_weather",
                                                                  "content": [1, 2]}]})},
    ]  # fmt: skip
    assert involves_tools(messages[:1], TOOLS) and involves_tools(messages, None)
    assert not involves_tools(messages[:1], None)


@requires_templates
@pytest.mark.parametrize("name", sorted(NOT_NATIVE))
def test_a_full_tool_round_renders_where_the_template_has_no_tools(name: str) -> None:
    render = renderer(template(name))
    prompt = ToolPrompt.probe(render)
    conversation = TOOL_ROUND if prompt.system_role else TOOL_ROUND[1:]
    text = render(prompt.messages(conversation, TOOLS), None)
    assert json.dumps(WEATHER["function"]) in text or json.dumps(WEATHER_PARAMS) in text
    assert REPLY_FORMAT in text and CALL_REPLY in text and RESULTS in text and "Thanks" in text
    # The assistant's call, as the history shows it, is what the parser reads back.
    parsed = GenericToolParser.parse(CALL_REPLY, NAMES)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_the_smollm2_prompt_grows_with_tools() -> None:
    render = renderer(SMOLLM2)
    prompt = ToolPrompt.probe(render)
    plain = render(TOOL_ROUND[1:2], TOOLS)
    assert plain == render(TOOL_ROUND[1:2], None)  # the template drops them
    written = render(prompt.messages(TOOL_ROUND[1:2], TOOLS), None)
    assert "get_weather" in written and len(written) > len(plain) + 300
    assert "named SmolLM" not in written  # the section is the system message now


# ---- the generic dialect ---------------------------------------------------------------------


def read(text: str, cuts: list[int] | None = None, **kwargs: Any) -> tuple[str, list[Any]]:
    """(content, [(name, arguments)]) parsed whole, or streamed in pieces cut at `cuts`."""
    kwargs.setdefault("tool_names", NAMES)
    if cuts is None:
        parsed = GenericToolParser.parse(text, **kwargs)
        return parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.calls]
    parser = GenericToolParser(**kwargs)
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    events = [e for a, b in zip(bounds, bounds[1:]) for e in parser.feed(text[a:b])]
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls: list[list[Any]] = []
    for event in events:
        if isinstance(event, ToolCallDelta):
            if event.id is not None:
                calls.append([event.name, ""])
            calls[-1][1] += event.arguments or ""
    return content, [(n, json.loads(a)) for n, a in calls]


PARIS = ("get_weather", {"city": "Paris"})
CASES: list[tuple[str, str, list[Any]]] = [
    (CALL_REPLY, "", [PARIS]),
    ('  {"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},\n'
     ' {"name": "get_time", "arguments": {}}]}\n', "", [PARIS, ("get_time", {})]),
    ('```json\n{"tool_calls": [{"name": "get_time", "arguments": {}}]}\n```', "",
     [("get_time", {})]),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),  # bare
    ('Let me check. {"tool_calls": [{"name": "get_time", "arguments": {}}]}', "Let me check.",
     [("get_time", {})]),
    ('{"tool_calls": [{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]}', "",
     [PARIS]),
    ('{"tool_calls": [{"name": "get_time", "arguments": {}},]} Done.', "Done.",
     [("get_time", {})]),
    ("Paris is sunny.", "Paris is sunny.", []),
    ('{"answer": "Paris"}', '{"answer": "Paris"}', []),  # JSON, but no call
    ('{"tool_calls": [{"name": "rm_rf", "arguments": {}}]}',
     '{"tool_calls": [{"name": "rm_rf", "arguments": {}}]}', []),  # not in tool_names
    ('{"tool_calls": 3}', '{"tool_calls": 3}', []),
    ('{"tool_calls": []}', '{"tool_calls": []}', []),
    ('{"tool_calls": [{"nam": 1}]}', '{"tool_calls": [{"nam": 1}]}', []),  # malformed call
    ("```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    ('Use {"tool_calls" wisely.', 'Use {"tool_calls" wisely.', []),
]  # fmt: skip


@pytest.mark.parametrize(("text", "content", "calls"), CASES)
def test_parse_content_and_calls(text: str, content: str, calls: list[Any]) -> None:
    for complete in (False, True):
        assert read(text, complete_calls=complete) == (content, calls)
        assert read(text, list(range(len(text))), complete_calls=complete) == (content, calls)


@settings(max_examples=300, deadline=None)
@given(
    case=st.sampled_from(CASES),
    cuts=st.lists(st.integers(0, 200), max_size=8),
    complete=st.booleans(),
)
def test_streamed_in_any_split_is_parsed_whole(case: Any, cuts: list[int], complete: bool) -> None:
    text = case[0]
    assert read(text, cuts, complete_calls=complete) == read(text, complete_calls=complete)


CUT = '{"tool_calls": [{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arg'
CUT += 'uments": {"ci'  # the second call is cut inside its arguments
BROKEN = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris",,}}]}'


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, 120), max_size=6))
def test_cut_off_or_broken_calls_are_dropped_with_complete_calls(cuts: list[int]) -> None:
    assert read(CUT, cuts, complete_calls=True) == ("", [("get_time", {})])
    assert read(CUT[:40], cuts, complete_calls=True) == ("", [])
    # Without complete_calls, parse() puts a region whose calls did not all complete back.
    assert read(CUT) == (CUT, [])
    broken = read(BROKEN, cuts, complete_calls=True)
    assert broken[1] == [] and "tool_calls" not in broken[0]
    assert read(BROKEN) == (BROKEN, [])


def test_registry_and_markers() -> None:
    assert get_tool_parser("generic") is GenericToolParser
    assert GenericToolParser.special_markers == ()
    assert isinstance(GenericToolParser.parse("x"), ParsedToolCalls)


# ---- the forced grammar ----------------------------------------------------------------------

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def accepts() -> Any:
    from localradix.constrained.grammar import _COMPILERS

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)

    def check(choice: Any, text: str, parallel: bool = True) -> bool:
        constraint = tool_call_constraint(TOOLS, choice, "generic", parallel)
        assert constraint is not None
        compiled = _COMPILERS[constraint.kind](compiler, constraint.spec)
        matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())

    return check


def test_forced_format_accepts_the_reply_format(accepts: Any) -> None:
    both = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
    both += '{"name": "get_time", "arguments": {}}]}'
    assert accepts("required", CALL_REPLY) and accepts("required", CALL_REPLY + "\n")
    assert accepts("required", both)
    assert not accepts("required", both, parallel=False)
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert accepts(named, CALL_REPLY)
    assert not accepts(named, '{"tool_calls": [{"name": "get_time", "arguments": {}}]}')
    assert read(both) == ("", [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})])


@pytest.mark.parametrize(
    "text",
    [
        '{"tool_calls": [{"name": "get_wether", "arguments": {"city": "Paris"}}]}',  # name
        '{"tool_calls": [{"name": "get_weather", "arguments": {"days": 2}}]}',  # no city
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": 7}}]}',  # type
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "P", "x": 1}}]}',
        '{"tool_calls": []}',
        "Paris is sunny.",
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',  # the parser's leniency only
    ],
)
def test_forced_format_rejects(accepts: Any, text: str) -> None:
    assert not accepts("required", text)
