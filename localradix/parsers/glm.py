"""GLM 4.5 / 4.6 / 4.7 dialect: one call per `<tool_call>` block, its arguments as tag pairs.

    <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>

GLM-4.7 writes a call on one line, as above; GLM-4.5 / 4.6 put a newline before the block,
after the name and after each tag:

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

Whitespace between the parts belongs to neither. A VALUE is the text between its tags: the
templates write strings raw and everything else with `tojson`; `param_value` types it back by
the function's schema. An `</arg_value>` not followed by the next `<arg_key>` or the end of the
block is part of the value. Parallel calls are several blocks. A block that does not read this
way (e.g. a hermes JSON call, the same tags) stays content.
"""

from __future__ import annotations

from typing import Any

from localradix.parsers.block_calls import BlockToolParser, Call, is_name, param_value, value_end
from localradix.parsers.json_scan import WHITESPACE
from localradix.parsers.structural_tag import (
    ArgsFormat,
    Format,
    Function,
    const,
    either,
    joined,
    optional,
    seq,
)

ARG_KEY = "<arg_key>"
END_KEY = "</arg_key>"
ARG_VALUE = "<arg_value>"
END_VALUE = "</arg_value>"


class Glm45ToolParser(BlockToolParser):
    name = "glm45"
    markers = ("<tool_call>",)
    end = "</tool_call>"
    # Single added tokens in GLM's vocabulary. Listing them is harmless where decoding shows
    # them anyway (the tokenizer manager skips those) and needed where they are special.
    special_markers = ("<tool_call>", "</tool_call>", ARG_KEY, END_KEY, ARG_VALUE, END_VALUE)

    def read_calls(self, body: str) -> list[Call] | None:
        index = body.find(ARG_KEY)
        index = len(body) if index == -1 else index  # a call without arguments
        name = body[:index].strip(WHITESPACE)
        if not is_name(name):
            return None
        arguments = self._read_arguments(name, body[index:])
        return None if arguments is None else [(name, arguments)]

    def _read_arguments(self, function: str, text: str) -> dict[str, Any] | None:
        arguments: dict[str, Any] = {}
        rest = text
        while rest:
            read = self._read_pair(function, rest)
            if read is None:
                return None
            key, value, rest = read
            arguments[key] = value
            rest = rest.lstrip(WHITESPACE)
        return arguments

    def _read_pair(self, function: str, text: str) -> tuple[str, Any, str] | None:
        """`<arg_key>KEY</arg_key>` `<arg_value>VALUE</arg_value>` at the start of `text`."""
        close = text.find(END_KEY)
        if not text.startswith(ARG_KEY) or close == -1:
            return None
        key = text[len(ARG_KEY) : close]
        if not key or "<" in key:  # a tag inside: this key never closed
            return None
        rest = text[close + len(END_KEY) :].lstrip(WHITESPACE)
        if not rest.startswith(ARG_VALUE):
            return None
        end = value_end(rest, len(ARG_VALUE), END_VALUE, (ARG_KEY,))  # or the block's end
        if end == -1:
            return None
        value = param_value(rest[len(ARG_VALUE) : end], self._schema(function, key))
        return key, value, rest[end + len(END_VALUE) :]

    @staticmethod
    def forced_format(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
        """`<tool_call>` blocks, each optionally after a newline (GLM-4.6 writes one, 4.7
        none); the glm_xml arguments allow the whitespace between tags either writes."""
        calls = [
            seq(const(f"<tool_call>{name}"), args(schema, style="glm_xml"), const("</tool_call>"))
            for name, schema in functions
        ]
        return joined(seq(optional(const("\n")), either(calls)), "", many)
