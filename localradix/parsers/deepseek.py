"""DeepSeek tool calls: V3.1's special-token blocks, and V3.2 / V4's DSML markup.

deepseek-v3.1 (DeepSeek-V3.1 / V3.1-Terminus), one block of calls, each NAME then JSON:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
    ...<｜tool▁calls▁end｜>

The same block in the older layout of DeepSeek-V3 and R1 (the R1-distill templates write it, and
the registry sends them here) is read too: a call's head is its type, `function`, and the name
follows the separator with the arguments in a JSON code fence, calls joined by newlines:

    <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>

deepseek-v3.2 (V3.2 wraps the calls in `function_calls`, V4 in `tool_calls`):

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

A parameter with string="true" holds raw text, one with string="false" JSON; without the
attribute the function's schema decides. V3.1's markers are control tokens; in V3.2 / V4 it is
`｜DSML｜` (the `<` before it is text), which the detokenizer must keep for the block to be seen.
"""

from __future__ import annotations

import json
import re
from typing import Any

from localradix.parsers.block_calls import BlockToolParser, Call, param_value
from localradix.parsers.structural_tag import (
    ArgsFormat,
    Format,
    Function,
    const,
    either,
    optional,
    seq,
    star,
)
from localradix.parsers.tool_stream import Region

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
DSML = "｜DSML｜"
# V3.2's wrapper, then V4's: the forced format offers both, the model picks its own.
DSML_BLOCKS = (f"<{DSML}function_calls>", f"<{DSML}tool_calls>")

_NAME = re.compile(r"[^\s<>{}\"'`]+")
# The old layout's body after the separator: NAME, then the arguments in a JSON code fence.
_FENCED = re.compile(r"\s*(?P<name>[^\s`]+)\s*```(?:json)?\s*(?P<args>.*?)\s*```\s*", re.S)
_INVOKE = re.compile(
    rf'\s*<{DSML}invoke\s+name="(?P<name>[^"]*)"\s*>(?P<body>.*?)</{DSML}invoke>', re.S
)
_PARAM = re.compile(
    rf'\s*<{DSML}parameter\s+name="(?P<name>[^"]*)"(?:\s+string="(?P<string>true|false)")?\s*>'
    rf"(?P<value>.*?)</{DSML}parameter>",
    re.S,
)


class DeepSeekV31ToolParser(BlockToolParser):
    name = "deepseek-v3.1"
    markers = (CALLS_BEGIN,)
    end = CALLS_END
    special_markers = (CALLS_BEGIN, CALL_BEGIN, SEP, CALL_END, CALLS_END)

    def read_calls(self, body: str) -> list[Call] | None:
        first, *items = body.split(CALL_BEGIN)
        if first.strip() or not items:
            return None
        calls: list[Call] = []
        for item in items:
            item = item.rstrip()
            call = _v31_call(item[: -len(CALL_END)]) if item.endswith(CALL_END) else None
            if call is None:
                return None
            calls.append(call)
        return calls

    @staticmethod
    def forced_format(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
        """V3.1's calls, or the older fenced layout the R1-distill templates write: the
        model takes the one it was trained on. Calls may be joined by a newline (as R1's are)."""
        calls = [
            seq(const(f"{CALL_BEGIN}{name}{SEP}"), args(schema), const(CALL_END))
            for name, schema in functions
        ] + [
            seq(
                const(f"{CALL_BEGIN}function{SEP}{name}\n```json\n"),
                args(schema),
                const(f"\n```{CALL_END}"),
            )
            for name, schema in functions
        ]
        call = either(calls)
        body = seq(call, star(seq(optional(const("\n")), call))) if many else call
        return seq(const(CALLS_BEGIN), body, const(CALLS_END))


def _v31_call(text: str) -> Call | None:
    """NAME<｜tool▁sep｜>{json}, or function<｜tool▁sep｜>NAME + fenced JSON."""
    head, sep, rest = text.partition(SEP)
    head = head.strip()
    if not sep:
        return None
    if head == "function" and not rest.lstrip().startswith("{"):
        fenced = _FENCED.fullmatch(rest)
        if fenced is None:
            return None
        head, rest = fenced["name"], fenced["args"]
    arguments = _json_object(rest)
    if arguments is None or not _NAME.fullmatch(head):
        return None
    return head, arguments


def _json_object(text: str) -> str | None:
    """The text, stripped, when it is a JSON object: sent as the model wrote it."""
    text = text.strip()
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return text if isinstance(value, dict) else None


class DeepSeekV32ToolParser(BlockToolParser):
    name = "deepseek-v3.2"
    markers = DSML_BLOCKS
    special_markers = (DSML,)

    def _region_step(self, region: Region, final: bool) -> bool:
        # A block closes with the closing tag of the wrapper that opened it.
        self.end = "</" + region.marker[1:]
        return super()._region_step(region, final)

    def read_calls(self, body: str) -> list[Call] | None:
        invokes = _matches(_INVOKE, body)
        if not invokes:
            return None
        calls: list[Call] = []
        for invoke in invokes:
            arguments = self._parameters(invoke["name"], invoke["body"])
            if arguments is None:
                return None
            calls.append((invoke["name"], arguments))
        return calls

    def _parameters(self, function: str, body: str) -> dict[str, Any] | None:
        params = _matches(_PARAM, body)
        if params is None:
            return None
        arguments: dict[str, Any] = {}
        for param in params:
            key, value, string = param["name"], param["value"], param["string"]
            if string == "true":
                arguments[key] = value  # raw text, exactly as written
            else:  # "false" is JSON; without the attribute the schema says
                schema = None if string == "false" else self._schema(function, key)
                arguments[key] = param_value(value, schema)
        return arguments

    @staticmethod
    def forced_format(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
        """The template's block: a blank line first (it writes one after any content), the
        wrapper of V3.2 or of V4, one `invoke` per call (each line ended by a newline)."""
        # The template writes one newline between parameters and no space around a value;
        # xgrammar allows whitespace at every seam, where more than one character would only
        # let a weak model wander (one is xgrammar's least).
        tight = ArgsFormat(1)
        calls = either(
            [
                seq(
                    const(f'<{DSML}invoke name="{name}">\n'),
                    tight(schema, style="deepseek_xml"),
                    const(f"</{DSML}invoke>\n"),
                )
                for name, schema in functions
            ]
        )
        body = seq(calls, star(calls)) if many else calls
        blocks = [seq(const(f"{tag}\n"), body, const("</" + tag[1:])) for tag in DSML_BLOCKS]
        return seq(optional(const("\n\n")), either(blocks))


def _matches(pattern: re.Pattern[str], text: str) -> list[re.Match[str]] | None:
    """`pattern` matched back to back over all of `text` (whitespace may follow the last);
    None when anything else is there."""
    found: list[re.Match[str]] = []
    pos = 0
    while (match := pattern.match(text, pos)) is not None:
        found.append(match)
        pos = match.end()
    return found if not text[pos:].strip() else None
