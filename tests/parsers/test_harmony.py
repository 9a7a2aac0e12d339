"""gpt-oss's harmony output: round trips through its real chat template (whole and streamed in
any split), what real models write that the template does not, calls that must stay content or
be dropped, and the forced-call grammar."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from template_turns import (
    CALLS,
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

from localradix.parsers.events import (
    ContentDelta,
    ParsedChatOutput,
    ReasoningContentDelta,
    ToolCall,
    ToolCallDelta,
)
from localradix.parsers.harmony import (
    HarmonyStreamParser,
    HarmonyToolParser,
    parse_harmony,
)
from localradix.parsers.output_parser import ChatOutputParser, parse_chat_output
from localradix.parsers.tool_calls import detect_tool_parser, get_tool_parser

GPT_OSS = "openai-gpt-oss-120b"
ENDS = ("<|call|>", "<|return|>")  # the stop tokens that end a generated turn
FUNCTIONS: list[Any] = [t["function"] for t in TOOLS]
NAMES = [f["name"] for f in FUNCTIONS]
CUTS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def message(content: str, reasoning: str | None, calls: Any) -> dict[str, Any]:
    """gpt-oss's template reads the reasoning from `thinking` (not `reasoning_content`)."""
    out = assistant_message(content, None, calls)
    if reasoning is not None:
        out["thinking"] = reasoning
    return out


def render(content: str, reasoning: str | None, calls: Any = ()) -> Turn:
    return turn_text(GPT_OSS, message(content, reasoning, calls), ENDS)


# (content, reasoning, calls) the template writes back as one turn: it renders one call per turn
# (tool_calls[0]), and a call turn's content as an analysis message, so a call turn carries
# reasoning and no content.
TURNS = [
    ("The answer is 4.", None, []),
    ("Done: *4*.\n\nAnything else?", "Two and two make four.\nEasy.", []),
    ("", "I need the weather first.", CALLS[:1]),
    ("", "Search the repo: naïve café 東京.", CALLS[1:]),
    ("", None, CALLS[:1]),
]
TURN_IDS = ["content", "reasoning+content", "reasoning+weather", "reasoning+search", "call"]


@requires_templates
@pytest.mark.parametrize(("content", "reasoning", "calls"), TURNS, ids=TURN_IDS)
def test_round_trip_whole(content: str, reasoning: str | None, calls: Any) -> None:
    turn = render(content, reasoning, calls)
    read = read_whole(turn, "harmony", "harmony")
    assert_round_trip(read, content, reasoning, calls)


@requires_templates
@pytest.mark.parametrize(("content", "reasoning", "calls"), TURNS, ids=TURN_IDS)
@CUTS
@given(data=st.data())
def test_round_trip_streamed(
    content: str, reasoning: str | None, calls: Any, data: st.DataObject
) -> None:
    turn = render(content, reasoning, calls)
    cuts = data.draw(st.lists(st.integers(0, len(turn.text)), max_size=12))
    assert_round_trip(read_streamed(turn, cuts, "harmony", "harmony"), content, reasoning, calls)


@requires_templates
@pytest.mark.parametrize("alias", ["harmony", "gpt-oss"])
def test_round_trip_character_by_character(alias: str) -> None:
    content, reasoning, calls = TURNS[3]
    turn = render(content, reasoning, calls)
    read = read_streamed(turn, range(len(turn.text)), alias, "harmony")
    assert_round_trip(read, content, reasoning, calls)


@requires_templates
def test_the_template_is_detected_and_the_turn_starts_after_the_generation_prompt() -> None:
    turn = render("Hi.", None)
    assert turn.prompt.endswith("<|start|>assistant")
    assert detect_tool_parser(template(GPT_OSS)) == "harmony"


# ---- what real models write ------------------------------------------------------------------

WEATHER_ARGS = '{"city": "Paris", "days": 3}'
REAL: list[tuple[str, str | None, str, list[tuple[str, str]]]] = [
    # (output, reasoning, content, calls): gpt-oss's own spellings of the header
    (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
        f"commentary to=functions.get_weather <|constrain|>json<|message|>{WEATHER_ARGS}",
        "Need weather.",
        "",
        [("get_weather", WEATHER_ARGS)],
    ),
    (
        f"<|channel|>commentary to=functions.get_weather json<|message|>{WEATHER_ARGS}<|call|>",
        None,
        "",
        [("get_weather", WEATHER_ARGS)],
    ),
    (
        "<|channel|>commentary to=functions.get_weather<|constrain|> json<|message|>"
        f"\n{WEATHER_ARGS}\n",
        None,
        "",
        [("get_weather", WEATHER_ARGS)],
    ),
    (  # a preamble the user sees, then the call
        "<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>commentary"
        "<|message|>Checking the weather.<|end|><|start|>assistant to=functions.get_weather"
        f"<|channel|>commentary <|constrain|>json<|message|>{WEATHER_ARGS}",
        "ok",
        "Checking the weather.",
        [("get_weather", WEATHER_ARGS)],
    ),
    (  # the final answer with no <|end|> (the end of output closes it)
        "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final"
        "<|message|>It is 4.",
        "Simple.",
        "It is 4.",
        [],
    ),
    (  # <|end|> left out before the next message
        "<|channel|>analysis<|message|>Simple.<|start|>assistant<|channel|>final<|message|>4",
        "Simple.",
        "4",
        [],
    ),
    (  # two analysis messages: one reasoning, a blank line between
        "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis"
        "<|message|>Two.<|end|><|start|>assistant<|channel|>final<|message|>Three.<|return|>",
        "One.\n\nTwo.",
        "Three.",
        [],
    ),
    ("Plain text, no header at all.", None, "Plain text, no header at all.", []),
    ("to be or not to be", None, "to be or not to be", []),
    (  # the output cut off inside a header: the markup is dropped
        "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>fin",
        "Hmm.",
        "",
        [],
    ),
]


def ids() -> Any:
    return (f"call_{i}" for i in itertools.count())


def streamed(
    text: str, cuts: Any, names: Any = NAMES, complete_calls: bool = True
) -> ParsedChatOutput:
    """What the stream sends for `text` cut at `cuts`, added up."""
    parser = HarmonyStreamParser(names, ids().__next__, complete_calls=complete_calls)
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    events = [e for a, b in itertools.pairwise(bounds) for e in parser.feed(text[a:b])]
    events += parser.finish()
    assert all(e.text for e in events if not isinstance(e, ToolCallDelta)), "no empty deltas"
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningContentDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert all(e.id is not None for e in calls), "each call is sent whole, in one delta"
    whole = [ToolCall(e.id or "", e.name or "", e.arguments) for e in calls]
    return ParsedChatOutput(reasoning or None, content, whole)


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), REAL)
def test_real_model_outputs(
    text: str, reasoning: str | None, content: str, calls: list[tuple[str, str]]
) -> None:
    parsed = parse_harmony(text, NAMES, ids().__next__, complete_calls=True)
    assert parsed.reasoning == reasoning
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    for call in parsed.calls:
        json.loads(call.arguments)
    for cut in range(len(text) + 1):
        assert streamed(text, [cut]) == parsed
    assert streamed(text, range(len(text))) == parsed


@pytest.mark.parametrize("text", [r[0] for r in REAL])
@CUTS
@given(data=st.data())
def test_output_depends_only_on_the_concatenated_input(text: str, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    assert streamed(text, cuts) == parse_harmony(text, NAMES, ids().__next__, complete_calls=True)


# Markers, their fragments, header words and JSON pieces, drawn in any order.
PIECES = [
    *HarmonyToolParser.special_markers,
    *["<|", "|>", "analysis", "final", "commentary", " to=functions.get_weather", " json"],
    *["a", " ", "\n", "{", "}", '"', "1", ":"],
]


@given(
    pieces=st.lists(st.sampled_from(PIECES), max_size=30),
    names=st.sampled_from([NAMES, None, ()]),
    complete_calls=st.booleans(),
    data=st.data(),
)
@settings(max_examples=500, deadline=None)
def test_any_text_streams_like_it_parses(
    pieces: list[str], names: Any, complete_calls: bool, data: st.DataObject
) -> None:
    """Never raises on any text, and how it is split never matters."""
    text = "".join(pieces)
    whole = parse_harmony(text, names, ids().__next__, complete_calls=complete_calls)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    assert streamed(text, cuts, names, complete_calls) == whole
    assert streamed(text, range(len(text)), names, complete_calls) == whole


def test_reasoning_and_content_stream_as_they_arrive() -> None:
    parser = HarmonyStreamParser(NAMES)
    assert parser.feed("<|channel|>analysis<|message|>Thinking ab") == [
        ReasoningContentDelta("Thinking ab")
    ]
    assert parser.feed("out it<|en") == [ReasoningContentDelta("out it")]  # "<|en" held
    assert parser.feed("d|><|start|>assistant<|channel|>final<|mess") == []
    assert parser.feed("age|>The answer") == [ContentDelta("The answer")]
    assert parser.feed(" is 4.") == [ContentDelta(" is 4.")]
    assert parser.finish() == []


def test_text_with_no_header_is_content_at_once() -> None:
    parser = HarmonyStreamParser(NAMES)
    assert parser.feed("t") == []  # may still be " to=functions..."
    assert parser.feed("he answer") == [ContentDelta("the answer")]
    assert parser.feed(" is <|en") == [ContentDelta(" is ")]
    assert parser.finish() == [ContentDelta("<|en")]


def test_a_call_is_sent_whole_once_its_message_ends() -> None:
    parser = HarmonyStreamParser(NAMES, ids().__next__, complete_calls=True)
    head = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    assert parser.feed(head + '{"city": ') == []
    assert parser.feed('"Paris"}') == []  # the end of output (<|call|>) may still be far
    assert parser.finish() == [ToolCallDelta(0, "call_0", "get_weather", '{"city": "Paris"}')]


# ---- calls that are not calls ----------------------------------------------------------------

CALL_TEXT = (
    "<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary"
    f" to=functions.get_weather <|constrain|>json<|message|>{WEATHER_ARGS}"
)
SHOWN = CALL_TEXT[CALL_TEXT.index("<|start|>") :]  # the call message as written


@pytest.mark.parametrize("tool_parser", [None, "harmony"])
def test_calls_with_no_tools_stay_content(tool_parser: str | None) -> None:
    """No tools in the request: what the model wrote as a call is shown, never lost."""
    names: list[str] | None = [] if tool_parser else None
    kwargs: dict[str, Any] = dict(tool_parser=tool_parser, tool_names=names, complete_calls=True)
    parsed = parse_chat_output(CALL_TEXT, reasoning_parser="harmony", **kwargs)
    assert parsed == ParsedChatOutput("Use the tool.", SHOWN, [])
    parser = ChatOutputParser(reasoning_parser="harmony", **kwargs)
    events = [e for c in CALL_TEXT for e in parser.feed(c)] + parser.finish()
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == SHOWN
    assert not any(isinstance(e, ToolCallDelta) for e in events)


@pytest.mark.parametrize(
    "recipient", ["functions.delete_everything", "browser.search", "python", "functions."]
)
def test_unknown_names_stay_content(recipient: str) -> None:
    text = CALL_TEXT.replace("functions.get_weather", recipient)
    for names in (NAMES, None):
        parsed = parse_harmony(text, names, complete_calls=True)
        if names is None and recipient == "functions.delete_everything":
            assert [c.name for c in parsed.calls] == ["delete_everything"]  # any name allowed
            continue
        assert parsed.calls == []
        assert parsed.content == SHOWN.replace("functions.get_weather", recipient)


def test_a_bare_name_is_a_call_only_when_the_tools_list_it() -> None:
    text = CALL_TEXT.replace("functions.get_weather", "get_weather")
    assert [c.name for c in parse_harmony(text, NAMES).calls] == ["get_weather"]
    assert parse_harmony(text, None).calls == []


@pytest.mark.parametrize("cut", range(len(CALL_TEXT) - len(WEATHER_ARGS) + 1, len(CALL_TEXT)))
def test_a_truncated_call_is_dropped_with_complete_calls(cut: int) -> None:
    """max_tokens cut the JSON: no call, and no call markup or JSON in the content."""
    text = CALL_TEXT[:cut]
    parsed = parse_harmony(text, NAMES, complete_calls=True)
    assert parsed == ParsedChatOutput("Use the tool.", "", [])
    assert streamed(text, range(len(text))) == parsed
    shown = parse_harmony(text, NAMES)  # without the mode it is shown as written instead
    assert shown.calls == [] and shown.content == text[text.index("<|start|>") :]


def test_a_call_that_is_not_a_json_object_is_no_call() -> None:
    for args in ('["Paris"]', '{"city": "Paris"} and more', "Paris"):
        text = f" to=functions.get_weather<|channel|>commentary json<|message|>{args}"
        assert parse_harmony(text, NAMES, complete_calls=True) == ParsedChatOutput(None, "", [])


# ---- the registry entry ----------------------------------------------------------------------


def test_registry_entry() -> None:
    cls = get_tool_parser("gpt-oss")
    assert cls is get_tool_parser("harmony") is HarmonyToolParser
    assert cls.name == "harmony"
    for marker in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>"):
        assert marker in cls.special_markers
    parsed = cls.parse(CALL_TEXT, NAMES, complete_calls=True)  # reasoning is left out
    assert parsed.content == "" and [c.name for c in parsed.calls] == ["get_weather"]
    parser = cls(NAMES, complete_calls=True)
    events = parser.feed(CALL_TEXT) + parser.finish()
    assert [type(e) for e in events] == [ToolCallDelta]


# ---- the forced-call grammar -----------------------------------------------------------------


@pytest.fixture(scope="module")
def compiler() -> Any:
    xgr = pytest.importorskip("xgrammar")
    return xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


def accepts(compiler: Any, constraint: Any, text: str) -> bool:
    import xgrammar as xgr

    from localradix.constrained.grammar import _COMPILERS

    compiled = _COMPILERS[constraint.kind](compiler, constraint.spec)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())


def forced(choice: Any = "required", parallel: bool = True, reasoning: Any = "harmony") -> Any:
    from localradix.parsers.tool_constraint import tool_call_constraint

    constraint = tool_call_constraint(TOOLS, choice, "gpt-oss", parallel, reasoning=reasoning)
    assert constraint is not None and constraint.kind == "structural_tag"
    return constraint


@requires_templates
@pytest.mark.parametrize("call", CALLS, ids=[c[0] for c in CALLS])
def test_forced_grammar_accepts_the_rendered_call_turn(compiler: Any, call: Any) -> None:
    for reasoning in ("Let me see: <b>{json}</b>\nthen call.", None):
        turn = render("", reasoning, [call])
        for constraint in (forced(), forced(named(call[0]), False)):
            assert accepts(compiler, constraint, turn.text), turn.text
        # Without the reasoning dialect (reasoning_effort "none") no analysis may come first.
        assert accepts(compiler, forced(reasoning=None), turn.text) == (reasoning is None)
        read = read_whole(turn, "harmony", "harmony")
        assert_round_trip(read, "", reasoning, [call])


def test_forced_grammar_accepts_gpt_oss_spelling_and_parses_back(compiler: Any) -> None:
    for text in (CALL_TEXT, CALL_TEXT + "\n", SHOWN[len("<|start|>assistant") :]):
        assert accepts(compiler, forced(), text), text
    parsed = parse_harmony(CALL_TEXT, NAMES, complete_calls=True)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", json.loads(WEATHER_ARGS))
    ]


@pytest.mark.parametrize(
    "text",
    [
        CALL_TEXT.replace("get_weather", "get_time"),  # no such function
        CALL_TEXT.replace('"days": 3', '"days": "three"'),  # not the schema's type
        CALL_TEXT.replace('"days": 3', '"days": 3, "colour": "red"'),  # not in the schema
        CALL_TEXT.replace(WEATHER_ARGS, '{"days": 3}'),  # a required property missing
        CALL_TEXT[: -len(WEATHER_ARGS)] + '{"city": "Paris"',  # unfinished
        "<|channel|>final<|message|>It is sunny.",  # an answer instead of a call
        CALL_TEXT + "<|end|><|start|>assistant" + SHOWN[len("<|start|>assistant") :],  # two
    ],
    ids=["unknown", "type", "extra", "missing", "unfinished", "answer", "two-calls"],
)
def test_forced_grammar_rejects(compiler: Any, text: str) -> None:
    assert not accepts(compiler, forced(), text)


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def test_named_choice_forces_that_function(compiler: Any) -> None:
    search = named("search_files")
    assert not accepts(compiler, forced(search, False), CALL_TEXT)
    other = CALL_TEXT.replace("get_weather", "search_files").replace(WEATHER_ARGS, '{"query": "x"}')
    assert accepts(compiler, forced(search, False), other)


def test_random_constrained_outputs_are_one_call(compiler: Any) -> None:
    """Walks through the grammar, token by token: every finished walk reads back as exactly one
    call of an allowed function, whole and streamed, its arguments valid for its schema. The
    special tokens are whole tokens and, as in a model, written only as structure: in the
    headers, and `<|end|>` to close the analysis."""
    import random
    import string

    import xgrammar as xgr

    from localradix.constrained.grammar import _COMPILERS, GrammarState

    jsonschema = pytest.importorskip("jsonschema")
    markers = HarmonyToolParser.special_markers
    chars = [c for c in string.printable[:95] if c not in "<|"]  # markers are special tokens
    vocab = [*chars, "\n", *markers, "<eos>"]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[len(vocab) - 1])
    tokens = xgr.GrammarCompiler(info, max_threads=1)
    schemas = {f["name"]: f["parameters"] for f in FUNCTIONS}
    rng = random.Random("harmony")
    done = 0
    for choice in ("required", named("search_files")):
        compiled = _COMPILERS["structural_tag"](tokens, forced(choice).spec)
        for _ in range(8):
            text = walk(GrammarState(xgr.GrammarMatcher(compiled)), vocab, rng)
            if text is None:
                continue  # a walk too long to finish
            parsed = parse_harmony(text, NAMES, complete_calls=True)
            assert len(parsed.calls) == 1 and not parsed.content.strip(), text
            call = parsed.calls[0]
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
            assert choice == "required" or call.name == "search_files"
            again = streamed(text, range(len(text)))
            assert (again.reasoning, again.content) == (parsed.reasoning, parsed.content)
            assert [(c.name, c.arguments) for c in again.calls] == [(call.name, call.arguments)]
            done += 1
    assert done >= 8


def walk(state: Any, vocab: list[str], rng: Any, steps: int = 3000) -> str | None:
    import numpy as np

    markers = set(HarmonyToolParser.special_markers)
    mask = np.zeros((1, (len(vocab) + 31) // 32), dtype=np.int32)
    out: list[str] = []
    for _ in range(steps):
        state.fill_mask(mask, 0)
        bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: len(vocab)]
        allowed = np.flatnonzero(bits).tolist()
        analysis = bool(out) and out[:3] == ["<|channel|>", *"an"]
        bodies = out.count("<|message|>") - analysis  # call bodies begun
        if analysis and "<|end|>" not in out and "<|message|>" in out:
            allowed = [t for t in allowed if vocab[t] not in markers or vocab[t] == "<|end|>"]
        elif bodies > 0:  # the JSON arguments: no special tokens
            allowed = [t for t in allowed if vocab[t] not in markers]
        token = rng.choices(allowed, [1.0 if vocab[t].isalnum() else 4.0 for t in allowed])[0]
        if token == len(vocab) - 1:
            return "".join(out)
        assert state.accept(token)
        out.append(vocab[token])
    return None
