"""Tool-call parsers: canned outputs of each dialect, streamed split at every position."""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localradix.parsers.events import ContentDelta, ParsedToolCalls, ToolCallDelta
from localradix.parsers.pythonic import parse_call
from localradix.parsers.tool_calls import (
    TOOL_PARSERS,
    ToolCallStreamParser,
    detect_tool_parser,
    get_tool_parser,
)

WS = " \t\n\r"
CALL_ID = re.compile(r"call_[0-9a-f]{24}")
MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")

# ---- running a stream and checking the shape of what it sends --------------------------------


class Streamed:
    def __init__(self, content: str, calls: list[tuple[str, str, str]]) -> None:
        self.content = content
        self.calls = calls  # (id, name, arguments)


def stream(cls: type[ToolCallStreamParser], chunks: list[str], **kwargs: Any) -> Streamed:
    parser = cls(**kwargs)
    events = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish())
    content: list[str] = []
    calls: list[list[str]] = []
    for event in events:
        if isinstance(event, ContentDelta):
            assert event.text
            content.append(event.text)
            continue
        assert isinstance(event, ToolCallDelta)
        wire = event.to_openai()
        if event.id is not None:  # the first delta of a call
            assert event.index == len(calls), "calls are numbered 0, 1, ... in order"
            assert event.name
            assert wire["type"] == "function" and wire["function"]["name"] == event.name
            calls.append([event.id, event.name, event.arguments])
        else:
            assert event.index == len(calls) - 1, "fragments belong to the latest call"
            assert event.name is None and event.arguments
            assert wire == {"index": event.index, "function": {"arguments": event.arguments}}
            calls[-1][2] += event.arguments
    return Streamed("".join(content), [(c[0], c[1], c[2]) for c in calls])


def same(streamed: Streamed, parsed: ParsedToolCalls) -> None:
    assert streamed.content == parsed.content
    assert [(n, a) for _, n, a in streamed.calls] == [(c.name, c.arguments) for c in parsed.calls]
    for _, _, arguments in streamed.calls:
        json.loads(arguments)


def splits(text: str) -> list[list[str]]:
    """Whole, character by character, and cut in two at every position."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(len(text) + 1)]


# ---- canned outputs --------------------------------------------------------------------------

W = {"city": "Paris", "unit": "celsius"}
CANNED: list[tuple[str, str, str, list[tuple[str, Any]]]] = [
    # (dialect, output, content, [(name, arguments)])
    (
        "hermes",
        'Let me check the weather.\n\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        "Let me check the weather.",
        [("get_weather", W)],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})],
    ),
    (
        "hermes",
        "The capital is <b>Paris</b>; <tool>s aside.",
        "The capital is <b>Paris</b>; <tool>s aside.",
        [],
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>',
        "",
        [("f", {"x": [1, 2]})],
    ),
    (
        "hermes",
        '<tool_call>\n{"arguments": {"q": "a\\"b}"}, "name": "search"}\n</tool_call>',
        "",
        [("search", {"q": 'a"b}'})],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "note", "arguments": {"text": "h\u00e9llo \\u00e9 \\n", '
        '"tags": [{"a": null}, true, -1.5e3, 0, 12]}}\n</tool_call>',
        "",
        [("note", {"text": "h\u00e9llo \u00e9 \n", "tags": [{"a": None}, True, -1500.0, 0, 12]})],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n\nDone.',
        "Done.",
        [("f", {})],
    ),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": 1}}', "", [("f", {"x": 1})]),
    (
        "hermes",
        '<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>',
        "",
        [("f", {"x": 1})],
    ),
    ("hermes", '<tool_call>\n{"name": "get_time"}\n</tool_call>', "", [("get_time", {})]),
    (
        "hermes",
        "Use <tool_call> tags like <tool_call>this</tool_call>.",
        "Use <tool_call> tags like <tool_call>this</tool_call>.",
        [],
    ),
    (
        "hermes",
        '<tool_call>\n{"id": 1}\n</tool_call> <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
        '<tool_call>\n{"id": 1}\n</tool_call>',
        [("f", {"a": 1})],
    ),
    ("hermes", "Trailing partial marker <tool_ca", "Trailing partial marker <tool_ca", []),
    (
        "hermes",
        '<tool_call>\n{"name": "A", "arguments":}}\n</tool_call>',
        '<tool_call>\n{"name": "A", "arguments":}}\n</tool_call>',
        [],
    ),
    (
        "hermes",
        "  leading space kept, trailing dropped before a call \n<tool_call>"
        '{"name": "f", "arguments": {"a": "</tool_call>"}}</tool_call>',
        "  leading space kept, trailing dropped before a call",
        [("f", {"a": "</tool_call>"})],
    ),
    (
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {}}',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    (
        "llama3",
        '{"type": "function", "name": "f", "parameters": {"a": [1, {"b": "}"}]}}',
        "",
        [("f", {"a": [1, {"b": "}"}]})],
    ),
    ("llama3", 'The answer is {"name": "f"}.', 'The answer is {"name": "f"}.', []),
    ("llama3", '{"answer": 42, "name": "x"}', '{"answer": 42, "name": "x"}', []),
    ("llama3", '  \n{"name": "f", "arguments": {"x": "y"}}\n', "", [("f", {"x": "y"})]),
    (
        "llama3",
        '{"name": "f", "parameters": {"x": 1}} and then some text',
        "and then some text",
        [("f", {"x": 1})],
    ),
    ("llama3", '{"name": "f", "parameters": {"x": 1}};', "", [("f", {"x": 1})]),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {}}]',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    (
        "mistral",
        'I will call it. [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}',
        "I will call it.",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "mistral",
        "Brackets [like this] and [TOOL] are content.",
        "Brackets [like this] and [TOOL] are content.",
        [],
    ),
    ("mistral", '[TOOL_CALLS] {"name": "f", "arguments": {"x": 1}}', "", [("f", {"x": 1})]),
    ("mistral", "[TOOL_CALLS]not a call", "[TOOL_CALLS]not a call", []),
    ("mistral", "[TOOL_CALLS][]", "[TOOL_CALLS][]", []),
    (
        "pythonic",
        '[get_weather(city="Paris", days=3)]',
        "",
        [("get_weather", {"city": "Paris", "days": 3})],
    ),
    (
        "pythonic",
        "[get_weather(city='Paris'), get_time(tz=\"UTC\", fmt=None, opts={'a': [1, 2]}, flag=True)]",
        "",
        [
            ("get_weather", {"city": "Paris"}),
            ("get_time", {"tz": "UTC", "fmt": None, "opts": {"a": [1, 2]}, "flag": True}),
        ],
    ),
    (
        "pythonic",
        '<|python_start|>[search(q="a(b)c]\\"", n=-2, ok=true)]<|python_end|>',
        "",
        [("search", {"q": 'a(b)c]"', "n": -2, "ok": True})],
    ),
    ("pythonic", "[1, 2, 3] are numbers", "[1, 2, 3] are numbers", []),
    ("pythonic", "[Link](http://example.com)", "[Link](http://example.com)", []),
    ("pythonic", "Text first [f(x=1)]", "Text first [f(x=1)]", []),
    ("pythonic", "[f(1, 2)]", "[f(1, 2)]", []),
    ("pythonic", "[a.b(x=1)]\nThat is all.", "That is all.", [("a.b", {"x": 1})]),
]

# Outputs whose call is cut off or broken after its header went out: parse() keeps them as
# content, while the stream already sent the call's beginning.
BROKEN: list[tuple[str, str]] = [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": }}\n</tool_call>'),
    ("hermes", 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": 1'),
    ("llama3", '{"name": "f", "parameters": {"x": [1, 2}}'),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"a": tru'),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1'),
]


def _case_id(case: tuple[Any, ...]) -> str:
    return f"{case[0]}:{case[1][:30]!r}"


@pytest.mark.parametrize("case", CANNED, ids=[_case_id(c) for c in CANNED])
def test_parse_canned(case: tuple[str, str, str, list[tuple[str, Any]]]) -> None:
    dialect, text, content, calls = case
    cls = get_tool_parser(dialect)
    parsed = cls.parse(text)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    id_pattern = MISTRAL_ID if dialect == "mistral" else CALL_ID
    for call in parsed.calls:
        assert id_pattern.fullmatch(call.id)
        assert call.to_openai() == {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
    assert len({c.id for c in parsed.calls}) == len(parsed.calls)


@pytest.mark.parametrize("case", CANNED, ids=[_case_id(c) for c in CANNED])
def test_stream_matches_parse_at_every_split(case: tuple[str, str, str, list[Any]]) -> None:
    dialect, text = case[0], case[1]
    cls = get_tool_parser(dialect)
    parsed = cls.parse(text)
    for chunks in splits(text):
        same(stream(cls, chunks), parsed)


@pytest.mark.parametrize("case", CANNED[:3] + CANNED[14:16] + CANNED[22:24] + CANNED[29:31])
def test_stream_matches_parse_at_every_pair_of_splits(
    case: tuple[str, str, str, list[Any]],
) -> None:
    dialect, text = case[0], case[1]
    cls = get_tool_parser(dialect)
    parsed = cls.parse(text)
    step = max(1, len(text) // 40)
    for i in range(0, len(text) + 1, step):
        for j in range(i, len(text) + 1):
            same(stream(cls, [text[:i], text[i:j], text[j:]]), parsed)


@pytest.mark.parametrize("case", BROKEN, ids=[_case_id(c) for c in BROKEN])
def test_broken_call_is_content_and_stream_is_split_independent(case: tuple[str, str]) -> None:
    dialect, text = case
    cls = get_tool_parser(dialect)
    parsed = cls.parse(text)
    assert parsed.content == text and parsed.calls == []
    whole = stream(cls, [text])
    assert len(whole.calls) == 1  # the stream had committed the call before it broke
    for chunks in splits(text):
        streamed = stream(cls, chunks)
        assert streamed.content == whole.content
        assert [c[1:] for c in streamed.calls] == [c[1:] for c in whole.calls]


def test_arguments_stream_before_the_call_ends() -> None:
    cls = get_tool_parser("hermes")
    parser = cls()
    events = parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert len(events) == 1
    first = events[0]
    assert isinstance(first, ToolCallDelta)
    assert first.to_openai() == {
        "index": 0,
        "id": first.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"ci'},
    }
    assert parser.feed('ty": "Paris"}}\n</tool') == [ToolCallDelta(0, arguments='ty": "Paris"}')]
    assert parser.feed("_call>") == []
    assert parser.finish() == []


def test_a_pythonic_call_with_a_windows_path_parses_without_warnings() -> None:
    """Python warns of the invalid escape in "C:\\dir" (a SyntaxWarning from 3.12, shown by
    default); the model's text is not our code, so the parser neither warns nor fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would turn into a SyntaxError: no call
        assert parse_call('open(path="C:\\dir")') == ("open", '{"path": "C:\\\\dir"}')


def test_marker_prefix_is_held_then_released() -> None:
    parser = get_tool_parser("hermes")()
    assert parser.feed("Hello <tool") == [ContentDelta("Hello")]
    assert parser.feed("box>") == [ContentDelta(" <toolbox>")]
    assert parser.feed(" ") == []
    assert parser.finish() == [ContentDelta(" ")]


def test_tool_names_restrict_calls() -> None:
    cls = get_tool_parser("hermes")
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert cls.parse(text, tool_names={"get_weather"}).calls == []
    assert cls.parse(text, tool_names={"get_weather"}).content == text
    assert [c.name for c in cls.parse(text, tool_names={"rm_rf"}).calls] == ["rm_rf"]
    same(stream(cls, list(text), tool_names={"get_weather"}), cls.parse(text, tool_names=set()))


def test_id_factory_is_used() -> None:
    ids = iter(["call_a", "call_b"])
    parsed = get_tool_parser("llama3").parse(
        '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {}}',
        id_factory=lambda: next(ids),
    )
    assert [c.id for c in parsed.calls] == ["call_a", "call_b"]


def test_feed_after_finish_raises() -> None:
    parser = get_tool_parser("hermes")()
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")


def test_registry() -> None:
    for name in TOOL_PARSERS:
        assert issubclass(get_tool_parser(name), ToolCallStreamParser)
    assert get_tool_parser("qwen3") is get_tool_parser("hermes")
    with pytest.raises(KeyError, match="known"):
        get_tool_parser("nope")


# ---- dialect detection from chat templates (excerpts of the real ones) -----------------------

QWEN25 = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}...# Tools\\n\\nYou may call one or more functions"
    "...<tools>{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}</tools>\\n\\nFor each "
    "function call, return a json object with function name and arguments within <tool_call>"
    '</tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}{%- endif %}"
)
QWEN3_CODER = (
    "<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1"
    "\\n</parameter>\\n</function>\\n</tool_call>"
)
LLAMA31 = (
    "{%- if builtin_tools is defined or tools is not none %}{{- 'Environment: ipython\\n' }}"
    "{%- endif %}...{{- '<|python_tag|>' + tool_call.name + '.call(' }}..."
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}"
)
LLAMA32 = "...{%- elif message.role == 'tool' %}{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}"
LLAMA32_PYTHONIC = (
    "You SHOULD NOT include any other text in the response if you call a function\\n"
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]"
)
LLAMA4 = "{{- '<|python_start|>' }}...{{- '<|python_end|>' }}{{- '<|header_start|>ipython<|header_end|>' }}"
MISTRAL_V3 = "{{- '[AVAILABLE_TOOLS] ' }}...{{- '[TOOL_CALLS] [' }}...{{- '[TOOL_RESULTS] ' }}"
MISTRAL_V11 = "{{- '[TOOL_CALLS]' + tool_call.function.name + '[ARGS]' + arguments }}"
PLAIN = "{% for message in messages %}<|im_start|>{{ message.role }}\\n{{ message.content }}{% endfor %}"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (QWEN25, "hermes"),
        (QWEN3_CODER, "qwen3-coder"),
        (LLAMA31, "llama3"),
        (LLAMA32, "llama3"),
        (LLAMA32_PYTHONIC, "pythonic"),
        (LLAMA4, "pythonic"),
        (MISTRAL_V3, "mistral"),
        (MISTRAL_V11, "mistral-v11"),
        (PLAIN, None),
        ("", None),
        (None, None),
    ],
)
def test_detect_tool_parser(template: str | None, expected: str | None) -> None:
    assert detect_tool_parser(template) == expected


# ---- property tests --------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
prose = st.lists(
    st.sampled_from(list("ab <>/[](){}\"'\n;,:_") + ["tool", "call", "TOOL_CALLS", "<tool_"]),
    max_size=20,
).map("".join)


def _dumps(value: Any, data: st.DataObject) -> str:
    indent = data.draw(st.sampled_from([None, 2]))
    return json.dumps(value, indent=indent, ensure_ascii=data.draw(st.booleans()))


def _render(
    dialect: str, calls: list[tuple[str, Any]], contents: list[str], data: st.DataObject
) -> str:
    if dialect == "hermes":
        pieces = [contents[0]]
        for (name, args), content in zip(calls, contents[1:]):
            body = f'{{"name": {json.dumps(name)}, "arguments": {_dumps(args, data)}}}'
            pieces.append(f"<tool_call>\n{body}\n</tool_call>{content}")
        return "".join(pieces)
    if dialect == "llama3":
        body = "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
        return contents[0] + body + contents[-1]
    if dialect == "mistral":
        if data.draw(st.booleans()):
            return "".join(
                [contents[0]]
                + [
                    f"[TOOL_CALLS]{n}[ARGS]{_dumps(a, data)}{c}"
                    for (n, a), c in zip(calls, contents[1:])
                ]
            )
        body = json.dumps([{"name": n, "arguments": a} for n, a in calls])
        return contents[0] + "[TOOL_CALLS]" + body + contents[-1]
    body = ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in calls)
    return contents[0] + f"[{body}]" + contents[-1]


@st.composite
def rendered(draw: st.DrawFn, dialect: str) -> tuple[str, list[tuple[str, Any]], list[int]]:
    data = draw(st.data())
    n = draw(st.integers(1, 3))
    calls: list[tuple[str, Any]]
    if dialect == "pythonic":
        python_args: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
            names,
            st.none()
            | st.booleans()
            | st.integers()
            | st.text(max_size=8)
            | st.lists(st.integers(), max_size=3),
            max_size=3,
        )
        calls = [(draw(names), draw(python_args)) for _ in range(n)]
    else:
        calls = [(draw(names), draw(arguments)) for _ in range(n)]
    contents = [draw(prose) for _ in range(n + 1)]
    if dialect in ("llama3", "pythonic"):  # the calls must open the output
        contents[0] = draw(st.sampled_from(["", " ", "\n"]))
    text = _render(dialect, calls, contents, data)
    return text, calls, data.draw(st.lists(st.integers(0, len(text)), max_size=8))


def _chunks(text: str, cuts: list[int]) -> list[str]:
    points = [0, *sorted(cuts), len(text)]
    return [text[a:b] for a, b in zip(points, points[1:])]


@pytest.mark.parametrize("dialect", ["hermes", "llama3", "mistral", "pythonic"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_well_formed_calls_stream_like_parse(dialect: str, data: st.DataObject) -> None:
    text, calls, cuts = data.draw(rendered(dialect))
    cls = get_tool_parser(dialect)
    parsed = cls.parse(text)
    same(stream(cls, _chunks(text, cuts)), parsed)
    # The generated calls come back unless the prose around them happens to form a marker.
    got = [(c.name, json.loads(c.arguments)) for c in parsed.calls]
    if dialect in ("hermes", "mistral") and len(got) != len(calls):
        return
    if dialect in ("llama3", "pythonic") and got[: len(calls)] != calls:
        return
    assert got[: len(calls)] == [(n, json.loads(json.dumps(a))) for n, a in calls]


noise = st.lists(
    st.sampled_from(
        list(' \n{}[]()":,;=x1')
        + [
            "<tool_call>",
            "</tool_call>",
            '"name"',
            '"arguments"',
            '"parameters"',
            "[TOOL_CALLS]",
            "[ARGS]",
            "<|python_tag|>",
            "<|python_start|>",
            "f(",
            "true",
            "\\",
        ]
    ),
    max_size=40,
).map("".join)


@st.composite
def mutated(draw: st.DrawFn, dialect: str) -> str:
    """A well-formed output with a few characters cut, inserted or the tail dropped."""
    text = draw(rendered(dialect))[0]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["cut", "insert", "truncate"]))
        if edit == "cut":
            text = text[:i] + text[i + draw(st.integers(1, 4)) :]
        elif edit == "insert":
            text = text[:i] + draw(noise) + text[i:]
        else:
            text = text[:i]
    return text


@pytest.mark.parametrize("dialect", ["hermes", "llama3", "mistral", "pythonic"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_property_any_text_streams_split_independently(
    dialect: str, data: st.DataObject, cuts: list[int]
) -> None:
    text = data.draw(noise | mutated(dialect))
    cls = get_tool_parser(dialect)
    parsed = cls.parse(text)  # never raises
    whole = stream(cls, [text])
    split = stream(cls, _chunks(text, [c for c in cuts if c <= len(text)]))
    assert split.content == whole.content
    assert [c[1:] for c in split.calls] == [c[1:] for c in whole.calls]
    # The stream differs from parse() only when it sent a call that then broke.
    if all(_is_json(a) for _, _, a in whole.calls) and len(whole.calls) == len(parsed.calls):
        same(whole, parsed)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
