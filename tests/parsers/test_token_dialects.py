"""The special-token dialects (DeepSeek V3.1 / V3.2 / V4, Kimi K2, Gemma 4, Granite 3): turns
written by the models' own chat templates read back exactly, whole and streamed in any split;
Kimi's ids survive the template's second turn; the forced grammar accepts what the templates
write and nothing off-schema; malformed, cut-off and unknown calls never become calls."""

from __future__ import annotations

import json
from dataclasses import dataclass
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
from localradix.parsers.events import ToolCallDelta
from localradix.parsers.output_parser import ParsedChatOutput, parse_chat_output
from localradix.parsers.reasoning import detect_reasoning_parser, get_reasoning_parser
from localradix.parsers.tool_calls import detect_tool_parser, get_tool_parser
from localradix.parsers.tool_constraint import tool_call_constraint
from localradix.sampling_params import Constraint

REASONING = "The user wants two things.\nFirst the weather, then a search."
CONTENT = "Let me check both."
NAMES = [name for name, _ in CALLS]  # the two functions in TOOLS
EOS = ("<｜end▁of▁sentence｜>",)
KIMI_END = ("<|im_end|>",)
GEMMA_END = ("<|tool_response>", "<turn|>")  # the model ends a turn of calls on the first


@dataclass(frozen=True)
class Spec:
    """How one template's turns are made: `kwargs` for the template; `reasoning`: the turn
    carries reasoning; `prepend_reasoning`: the prompt opens a reasoning block that the
    template leaves empty, so the model's reasoning comes first in the turn; `prompt_kwargs`:
    the model's prompt is rendered with these instead (the turn as the template writes it)."""

    template: str
    dialect: str
    end: tuple[str, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()
    reasoning: bool = False
    prepend_reasoning: bool = False
    prompt_kwargs: tuple[tuple[str, Any], ...] | None = None

    @property
    def id(self) -> str:
        flags = ",".join(f"{k}={v}" for k, v in self.kwargs)
        return f"{self.template}[{flags}]" + ("-prompt-off" if self.prompt_kwargs == () else "")


THINK = (("thinking", True),)
GEMMA_THINK = (("enable_thinking", True),)
SPECS = [
    Spec("deepseek-ai-DeepSeek-V3.1", "deepseek-v3.1", EOS),
    # V3.1's template drops reasoning_content: the model writes it after the prompt's <think>.
    Spec("deepseek-ai-DeepSeek-V3.1", "deepseek-v3.1", EOS, THINK, True, prepend_reasoning=True),
    Spec("deepseek-ai-DeepSeek-V3.2", "deepseek-v3.2", EOS, THINK, True),
    Spec("deepseek-ai-DeepSeek-V4", "deepseek-v3.2", EOS, THINK, True),
    Spec("deepseek-ai-DeepSeek-V4", "deepseek-v3.2", EOS),
    Spec("deepseek-ai-DeepSeek-V4-Flash-0731", "deepseek-v3.2", EOS, THINK, True),
    Spec("moonshotai-Kimi-K2", "kimi-k2", KIMI_END),
    Spec("Kimi-K2-Instruct", "kimi-k2", KIMI_END),
    Spec("Kimi-K2-Thinking", "kimi-k2", KIMI_END, reasoning=True),
    Spec("google-gemma-4-31B-it", "gemma4", GEMMA_END, GEMMA_THINK, True),
    Spec("google-gemma-4-31B-it-interleaved", "gemma4", GEMMA_END, GEMMA_THINK, True),
    # Thinking off: the prompt ends in an empty thought channel and the model writes no
    # reasoning (the turn is the thinking-on render of a message without any).
    Spec("google-gemma-4-31B-it", "gemma4", GEMMA_END, GEMMA_THINK, prompt_kwargs=()),
    Spec("google-gemma-4-31B-it-interleaved", "gemma4", GEMMA_END, GEMMA_THINK, prompt_kwargs=()),
]
REASONING_DIALECT = {
    "deepseek-ai-DeepSeek-V3.1": "deepseek-r1",
    "deepseek-ai-DeepSeek-V3.2": "deepseek-r1",
    "deepseek-ai-DeepSeek-V4": "deepseek-r1",
    "deepseek-ai-DeepSeek-V4-Flash-0731": "deepseek-r1",
    "moonshotai-Kimi-K2": None,
    "Kimi-K2-Instruct": None,
    "Kimi-K2-Thinking": "qwen3",
    "google-gemma-4-31B-it": "gemma4",
    "google-gemma-4-31B-it-interleaved": "gemma4",
    "ibm-granite-granite-3.3-2B-Instruct": "qwen3",
}
COMMON = {"tools": TOOLS, "bos_token": "<s>", "eos_token": "</s>"}


def render(name: str, messages: list[dict[str, Any]], generation: bool, **kwargs: Any) -> str:
    return render_chat_template(
        template(name), messages=messages, add_generation_prompt=generation, **COMMON, **kwargs
    )


def make_turn(
    spec: Spec, content: str, calls: list[tuple[str, dict[str, Any]]], with_reasoning: bool
) -> Turn:
    reasoning = REASONING if with_reasoning else None
    turn = turn_text(
        spec.template, assistant_message(content, reasoning, calls), spec.end, **dict(spec.kwargs)
    )
    if spec.prompt_kwargs is not None:
        prompt = render(spec.template, CONVERSATION, True, **dict(spec.prompt_kwargs))
        turn = Turn(prompt, turn.text)
    if spec.prepend_reasoning and reasoning is not None:
        turn = Turn(turn.prompt, reasoning + turn.text)
    return turn


def dialects(name: str) -> tuple[str | None, str | None]:
    source = template(name)
    return detect_tool_parser(source), detect_reasoning_parser(source)


# ---- 1. round trips through the real templates ----------------------------------------------


@requires_templates
@pytest.mark.parametrize("spec", SPECS, ids=[s.id for s in SPECS])
def test_templates_pick_these_dialects(spec: Spec) -> None:
    assert dialects(spec.template) == (spec.dialect, REASONING_DIALECT[spec.template])


@requires_templates
@pytest.mark.parametrize("content", [CONTENT, ""], ids=["content", "no-content"])
@pytest.mark.parametrize("n", [0, 1, 2])
@pytest.mark.parametrize("spec", SPECS, ids=[s.id for s in SPECS])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(0, 400)))
def test_round_trip(spec: Spec, n: int, content: str, cuts: list[int]) -> None:
    turn = make_turn(spec, content, CALLS[:n], spec.reasoning)
    tool_parser, reasoning_parser = dialects(spec.template)
    # Reasoning where the template writes it (Gemma's only beside calls).
    reasoning = REASONING if REASONING in turn.text else None
    assert_round_trip(
        read_whole(turn, tool_parser, reasoning_parser), content, reasoning, CALLS[:n]
    )
    streamed = read_streamed(turn, cuts, tool_parser, reasoning_parser)
    assert_round_trip(streamed, content, reasoning, CALLS[:n])


R1_CASES = [
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", 1),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", 2),
    ("llama-cpp-deepseek-r1", 1),
    ("llama-cpp-deepseek-r1", 2),
    # This template closes the block only after a second call.
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", 2),
]


def r1_turn(name: str, content: str, calls: list[tuple[str, dict[str, Any]]]) -> Turn:
    """The R1-style templates (which the registry reads as deepseek-v3.1) write a message's
    calls, in the old fenced layout, as a turn of their own without content or reasoning; their
    generation prompt opens the reasoning. The model writes its reasoning, `</think>`, its
    content, then the block."""
    text_args = name.endswith("Llama-8B")  # it concatenates the arguments: JSON text only
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": f, "arguments": json.dumps(a) if text_args else a},
            }
            for i, (f, a) in enumerate(calls)
        ],
    }
    prompt = render(name, CONVERSATION, True, enable_thinking=True)
    full = render(name, [*CONVERSATION, message], False, enable_thinking=True)
    start = full.rindex("<｜tool▁calls▁begin｜>")  # the last: a system prompt may show one
    end = full.index("<｜tool▁calls▁end｜>", start) + len("<｜tool▁calls▁end｜>")
    return Turn(prompt, f"{REASONING}\n</think>\n\n{content}{full[start:end]}")


@requires_templates
@pytest.mark.parametrize("content", [CONTENT, ""], ids=["content", "no-content"])
@pytest.mark.parametrize(("name", "n"), R1_CASES)
@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(0, 400)))
def test_r1_layout_round_trip(name: str, n: int, content: str, cuts: list[int]) -> None:
    assert dialects(name) == ("deepseek-v3.1", "deepseek-r1")
    turn = r1_turn(name, content, CALLS[:n])
    assert "```json" in turn.text
    for read in (
        read_whole(turn, "deepseek-v3.1", "deepseek-r1"),
        read_streamed(turn, cuts, "deepseek-v3.1", "deepseek-r1"),
    ):
        assert_round_trip(read, content, REASONING, CALLS[:n])


GRANITE = "ibm-granite-granite-3.3-2B-Instruct"


def granite_turn(content: str, calls: list[tuple[str, dict[str, Any]]]) -> Turn:
    """Granite 3.3's template writes no calls back: a turn of calls is the format its system
    prompt asks for, `<|tool_call|>` and a JSON list (written as json.dumps does)."""
    turn = turn_text(GRANITE, assistant_message(content, None, []), "<|end_of_text|>")
    if not calls:
        return turn
    listed = [{"name": name, "arguments": arguments} for name, arguments in calls]
    return Turn(turn.prompt, turn.text + "<|tool_call|>" + json.dumps(listed, ensure_ascii=False))


@requires_templates
@pytest.mark.parametrize("content", [CONTENT, ""], ids=["content", "no-content"])
@pytest.mark.parametrize("n", [0, 1, 2])
@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(0, 400)))
def test_granite_round_trip(n: int, content: str, cuts: list[int]) -> None:
    assert dialects(GRANITE) == ("granite", "qwen3")
    assert "<|tool_call|> followed by a JSON list" in template(GRANITE)
    turn = granite_turn(content, CALLS[:n])
    for read in (
        read_whole(turn, "granite", "qwen3"),
        read_streamed(turn, cuts, "granite", "qwen3"),
    ):
        assert_round_trip(read, content, None, CALLS[:n])


# ---- Kimi: the ids are the model's, and the template's next turn writes them back -----------

KIMI = ["moonshotai-Kimi-K2", "Kimi-K2-Instruct", "Kimi-K2-Thinking"]


def kimi_read(name: str, text: str) -> ParsedChatOutput:
    return parse_chat_output(
        text,
        tool_parser="kimi-k2",
        reasoning_parser=REASONING_DIALECT[name],
        tool_names=NAMES,
        complete_calls=True,
    )


def sent_back(parsed: ParsedChatOutput) -> list[dict[str, Any]]:
    """What a client sends next: the assistant message as we returned it (the server turns
    each call's JSON arguments into a dict for the template), then one result per call id."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.loads(call.arguments)},
            }
            for call in parsed.calls
        ],
    }
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    results = [
        {"role": "tool", "tool_call_id": call.id, "content": f"result {i}"}
        for i, call in enumerate(parsed.calls)
    ]
    return [message, *results]


@requires_templates
@pytest.mark.parametrize("name", KIMI)
def test_kimi_ids_round_trip_a_second_turn(name: str) -> None:
    reasoning = REASONING if name == "Kimi-K2-Thinking" else None
    first = turn_text(name, assistant_message(CONTENT, reasoning, CALLS), KIMI_END)
    parsed = kimi_read(name, first.text)
    assert [c.id for c in parsed.calls] == ["functions.get_weather:0", "functions.search_files:1"]
    history = [*CONVERSATION, *sent_back(parsed)]
    prompt = render(name, history, True)
    # The history holds the turn exactly as the model wrote it, each result under its id.
    assert prompt.startswith(first.prompt + first.text)
    for call in parsed.calls:
        assert f"## Return of {call.id}" in prompt
    # The second turn: whatever index the template counts to, the id is the text written.
    again = assistant_message("", None, [("get_weather", {"city": "Rome"})])
    full = render(name, [*history, again], False)
    assert full.startswith(prompt)
    text = full[len(prompt) : full.index(KIMI_END[0], len(prompt))]
    second = kimi_read(name, text)
    [call] = second.calls
    assert f"<|tool_call_begin|>{call.id}<|tool_call_argument_begin|>" in text
    final = render(name, [*history, *sent_back(second)], True)
    assert final.startswith(prompt + text)
    assert f"## Return of {call.id}" in final[len(prompt + text) :]


def test_kimi_ids_without_prefix_and_the_factory_for_nothing_else() -> None:
    text = (
        "<|tool_calls_section_begin|><|tool_call_begin|> get_weather:7 "
        '<|tool_call_argument_begin|> {"city": "Oslo"} <|tool_call_end|><|tool_calls_section_end|>'
    )
    parser = get_tool_parser("kimi-k2")
    parsed = parser.parse(text, id_factory=lambda: "unused")
    assert [(c.id, c.name, c.arguments) for c in parsed.calls] == [
        ("get_weather:7", "get_weather", '{"city": "Oslo"}')
    ]


# ---- Gemma 4: what the model generates in one turn -------------------------------------------

GEMMA = ["google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved"]


@requires_templates
@pytest.mark.parametrize("name", GEMMA)
def test_gemma4_content_before_or_after_the_calls(name: str) -> None:
    """In one generation the model thinks, calls and stops on `<|tool_response>`; the template
    puts a message's content after its calls (it is the answer written after the results).
    Content before the calls, or after them, reads the same."""
    spec = Spec(name, "gemma4", GEMMA_END, GEMMA_THINK, True)
    calls_only = make_turn(spec, "", CALLS, True)
    thought, sep, block = calls_only.text.partition("<channel|>")
    assert sep and block.startswith("<|tool_call>") and block.endswith("<tool_call|>")
    after = make_turn(spec, CONTENT, CALLS, True)
    assert after.text == calls_only.text + CONTENT
    before = Turn(calls_only.prompt, thought + sep + CONTENT + block)
    for turn in (before, after):
        for read in (
            read_whole(turn, "gemma4", "gemma4"),
            read_streamed(turn, [7, 70, 140], "gemma4", "gemma4"),
        ):
            assert_round_trip(read, CONTENT, REASONING, CALLS)


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("{a:None,b:null,c:True,d:false}", {"a": None, "b": None, "c": True, "d": False}),
        ('{<|"|>k<|"|>:1,"q":"x\\"y",n:-2.5e3}', {"k": 1, "q": 'x"y', "n": -2500.0}),
        ('{ s : <|"|>a, b: {c}<|"|> , l : [ ] , o : { } }', {"s": "a, b: {c}", "l": [], "o": {}}),
    ],
)
def test_gemma4_values(written: str, value: dict[str, Any]) -> None:
    text = f"<|tool_call>call:f{written}<tool_call|>"
    [call] = get_tool_parser("gemma4").parse(text).calls
    assert (call.name, json.loads(call.arguments)) == ("f", value)


# ---- 2. the forced grammar accepts what the templates write ----------------------------------

xgr = pytest.importorskip("xgrammar")
from localradix.constrained.grammar import _COMPILERS  # noqa: E402 - needs xgrammar


@pytest.fixture(scope="module")
def compiler() -> Any:
    return xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


def accepts(compiler: Any, constraint: Constraint | None, text: str) -> bool:
    assert constraint is not None
    compiled = _COMPILERS[constraint.kind](compiler, constraint.spec)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())


GRAMMAR_SPECS = [s for s in SPECS if s.prompt_kwargs is None and not s.prepend_reasoning]


def forced(spec: Spec | None, choice: Any, parallel: bool, prompt: str) -> Any:
    """The constraint the server builds for this template's prompt (None: Granite's)."""
    name = spec.template if spec else GRANITE
    tool_parser, reasoning_parser = dialects(name)
    assert tool_parser is not None
    kwargs: dict[str, Any] = {}
    if reasoning_parser is not None:
        opens = get_reasoning_parser(reasoning_parser).prompt_opens_reasoning(prompt)
        kwargs = {"reasoning": reasoning_parser, "starts_in_reasoning": opens}
    return tool_call_constraint(TOOLS, choice, tool_parser, parallel, **kwargs)


def written(spec: Spec | None, calls: list[tuple[str, dict[str, Any]]]) -> Turn:
    """A calls-only turn as the template writes it. Gemma's template renders a null as
    Python's `None`; xgrammar's gemma style (the model's format) writes `null`."""
    if spec is None:
        return granite_turn("", calls)
    turn = make_turn(spec, "", calls, False)
    if spec.dialect == "gemma4":
        turn = Turn(turn.prompt, turn.text.replace(":None", ":null"))
    return turn


ALL_GRAMMAR = [*GRAMMAR_SPECS, None]
GRAMMAR_IDS = [s.id for s in GRAMMAR_SPECS] + [GRANITE]
BAD_CALLS: list[list[tuple[str, dict[str, Any]]]] = [
    [("get_time", {})],  # a function that is not in tools
    [("get_weather", {"city": "Paris", "days": "three"})],  # days must be an integer
    [("get_weather", {"days": 3})],  # city is required
    [("get_weather", {"city": "Paris", "units": "K"})],  # not in the enum
]


@requires_templates
@pytest.mark.parametrize("spec", ALL_GRAMMAR, ids=GRAMMAR_IDS)
def test_required_accepts_the_template_turn(compiler: Any, spec: Spec | None) -> None:
    turn = written(spec, CALLS)
    constraint = forced(spec, "required", True, turn.prompt)
    assert accepts(compiler, constraint, turn.text), turn.text
    for bad in BAD_CALLS:
        wrong = written(spec, bad)
        assert not accepts(compiler, constraint, wrong.text), wrong.text


@requires_templates
@pytest.mark.parametrize("spec", ALL_GRAMMAR, ids=GRAMMAR_IDS)
def test_one_call_unless_parallel_and_a_named_choice(compiler: Any, spec: Spec | None) -> None:
    one, two = written(spec, CALLS[:1]), written(spec, CALLS)
    single = forced(spec, "required", False, one.prompt)
    assert accepts(compiler, single, one.text)
    assert not accepts(compiler, single, two.text)
    named = forced(
        spec, {"type": "function", "function": {"name": "search_files"}}, True, one.prompt
    )
    search = written(spec, CALLS[1:])
    assert accepts(compiler, named, search.text)
    assert not accepts(compiler, named, one.text)
    assert not accepts(compiler, named, two.text)


FORCED_EXTRA = {
    "deepseek-v3.1": [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```"
        "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Oslo"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    ],
    "deepseek-v3.2": [
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_time">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
        'string="true">Oslo</｜DSML｜parameter>\n<｜DSML｜parameter name="units" string="true">C'
        "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    ],
    "kimi-k2": [
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:12"
        "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
    ],
    "gemma4": [
        '<|tool_call>call:get_time{}<tool_call|><|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,'
        "days:2}<tool_call|>",
    ],
}


@pytest.mark.parametrize("dialect", ["deepseek-v3.1", "deepseek-v3.2", "kimi-k2", "gemma4"])
def test_forced_calls_parse_back(compiler: Any, dialect: str) -> None:
    """Text the grammar accepts beyond the templates' (V4's wrapper, the fenced layout, a
    high Kimi index, a function without parameters) is read back as calls."""
    tools = [*TOOLS, {"type": "function", "function": {"name": "get_time"}}]
    constraint = tool_call_constraint(tools, "required", dialect, True)
    for text in FORCED_EXTRA[dialect]:
        assert accepts(compiler, constraint, text), text
        parsed = get_tool_parser(dialect).parse(text, complete_calls=True)
        assert parsed.content == "" and parsed.calls, text


# ---- 3. edge cases, every dialect ------------------------------------------------------------

ONE_CALL = {
    "deepseek-v3.1": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek-v3.2": '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    "kimi-k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    "granite": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
}
MALFORMED = {
    "deepseek-v3.1": [
        ONE_CALL["deepseek-v3.1"].replace('"Paris"', "Paris"),  # not JSON
        ONE_CALL["deepseek-v3.1"].replace("<｜tool▁sep｜>", ""),  # no separator
    ],
    "deepseek-v3.2": [
        ONE_CALL["deepseek-v3.2"].replace("</｜DSML｜parameter>", ""),  # unclosed parameter
        ONE_CALL["deepseek-v3.2"].replace('invoke name="get_weather"', "invoke"),
    ],
    "kimi-k2": [
        ONE_CALL["kimi-k2"].replace(":0", ""),  # an id without its index
        ONE_CALL["kimi-k2"].replace('{"city": "Paris"}', '["Paris"]'),  # not an object
    ],
    "gemma4": [
        ONE_CALL["gemma4"].replace('<|"|>Paris<|"|>', "Paris"),  # a bare word
        ONE_CALL["gemma4"].replace("call:", ""),
        ONE_CALL["gemma4"].replace("}<tool_call|>", "<tool_call|>"),
    ],
    "granite": ["<|tool_call|>I cannot call tools here.", '<|tool_call|>[{"nome": "x"}]'],
}
DIALECTS = list(ONE_CALL)
PARIS = [("get_weather", {"city": "Paris"})]


def read(dialect: str, text: str, **kwargs: Any) -> tuple[str, list[tuple[str, Any]]]:
    """Content and calls with complete_calls; streamed one character at a time it is the same."""
    cls = get_tool_parser(dialect)
    kwargs = {"complete_calls": True, **kwargs}
    parsed = cls.parse(text, **kwargs)
    whole = (parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.calls])
    parser = cls(**kwargs)
    events = [e for ch in text for e in parser.feed(ch)] + parser.finish()
    content = "".join(e.text for e in events if not isinstance(e, ToolCallDelta))
    calls = [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCallDelta)]
    assert (content, calls) == whole
    return whole


@pytest.mark.parametrize("dialect", DIALECTS)
def test_content_before_the_calls(dialect: str) -> None:
    assert read(dialect, ONE_CALL[dialect]) == ("", PARIS)
    assert read(dialect, "Checking.\n\n" + ONE_CALL[dialect]) == ("Checking.", PARIS)
    twice = ONE_CALL[dialect] + "\n" + ONE_CALL[dialect] + " Done."
    assert read(dialect, twice) == ("Done.", PARIS + PARIS)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_malformed_block_stays_content(dialect: str) -> None:
    for text in MALFORMED[dialect]:
        assert read(dialect, "Checking. " + text) == ("Checking. " + text, []), text


@pytest.mark.parametrize("dialect", DIALECTS)
def test_block_cut_off_by_the_end_is_dropped(dialect: str) -> None:
    block = ONE_CALL[dialect]
    for cut in range(1, len(block) - 1):
        content, calls = read(dialect, "Checking. " + block[:cut])
        assert content.strip() == "Checking.", block[:cut]
        # Granite streams a JSON list: a call complete before the cut list's `]` is a call.
        assert calls == [] or (dialect == "granite" and calls == PARIS), block[:cut]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_names_outside_tool_names_stay_content(dialect: str) -> None:
    text = "Checking. " + ONE_CALL[dialect]
    assert read(dialect, text, tool_names=["search_files"]) == (text, [])
    assert read(dialect, text, tool_names=["get_weather"]) == ("Checking.", PARIS)


def test_dsml_values_follow_the_string_attribute_then_the_schema() -> None:
    text = (
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n'
        '<｜DSML｜parameter name="a" string="true">42</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="b" string="false">42</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="c">42</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="d">42</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    schemas = {"f": {"type": "object", "properties": {"c": {"type": "string"}}}}
    [call] = get_tool_parser("deepseek-v3.2").parse(text, tool_schemas=schemas).calls
    assert json.loads(call.arguments) == {"a": "42", "b": 42, "c": "42", "d": 42}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_special_markers_cover_the_markers_read(dialect: str) -> None:
    cls = get_tool_parser(dialect)
    assert cls.special_markers
    for marker in cls.markers:
        assert any(special in marker for special in cls.special_markers), marker
    assert all(special in ONE_CALL[dialect] for special in cls.special_markers)


def test_xml_styles_keep_to_the_template_spacing(compiler: Any) -> None:
    """DSML and Gemma arguments allow one whitespace character at a seam (the templates write
    at most one), so a weak model cannot spend its tokens on blank lines."""
    dsml = tool_call_constraint(TOOLS, "required", "deepseek-v3.2", True)
    call = ONE_CALL["deepseek-v3.2"]
    assert accepts(compiler, dsml, call)
    assert not accepts(
        compiler, dsml, call.replace(">\n<｜DSML｜parameter", ">\n\n\n<｜DSML｜parameter")
    )
    gemma = tool_call_constraint(TOOLS, "required", "gemma4", True)
    call = ONE_CALL["gemma4"]
    assert accepts(compiler, gemma, call.replace("city:", "city: "))
    assert not accepts(compiler, gemma, call.replace("city:", "city:   "))
