"""Gemma 4 tool calls: one block per call, arguments in Gemma's own object notation:

    <|tool_call>call:NAME{city:<|"|>Paris<|"|>,days:3,opts:{a:[1,<|"|>b<|"|>]}}<tool_call|>

Keys are bare (a key between `<|"|>` or JSON quotes is read too), strings sit between `<|"|>`
marks at every level and are raw text (no escapes), numbers, booleans and null are JSON;
Python's `True`, `False` and `None` are read as well, since the chat template renders
arguments with Jinja, which writes a null that way. `<|tool_call>`, `<tool_call|>` and `<|"|>`
are control tokens.

In one turn the model thinks in its thought channel (the `gemma4` reasoning dialect), writes
its calls back to back and ends the turn (on `<|tool_response>`); its answer comes in the next
generation, after the results. The template writes that answer after the calls of the same
message, which this parser reads as content as well.
"""

from __future__ import annotations

import json
import re
from typing import Any

from localradix.parsers.block_calls import BlockToolParser, Call
from localradix.parsers.structural_tag import (
    ArgsFormat,
    Format,
    Function,
    const,
    either,
    joined,
    seq,
)

CALL_OPEN = "<|tool_call>"
CALL_CLOSE = "<tool_call|>"
QUOTE = '<|"|>'

_HEAD = re.compile(r"\s*call:(?P<name>[^\s{]+)\s*(?=\{)")
_KEY = re.compile(r"[^\s:,{}\[\]<>\"]+")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_WORDS: dict[str, Any] = {
    "true": True,
    "false": False,
    "null": None,
    "True": True,
    "False": False,
    "None": None,
}
_WORD = re.compile("|".join(_WORDS))
_ENDS_VALUE = re.compile(r"\s*(?:[,}\]]|$)")
# Schema keywords whose values are schemas (or maps / lists of schemas).
_SUBSCHEMAS = ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf", "allOf", "not")
_SCHEMA_MAPS = ("$defs", "definitions", "patternProperties")


class Gemma4ToolParser(BlockToolParser):
    name = "gemma4"
    markers = (CALL_OPEN,)
    end = CALL_CLOSE
    special_markers = (CALL_OPEN, CALL_CLOSE, QUOTE)

    def read_calls(self, body: str) -> list[Call] | None:
        head = _HEAD.match(body)
        if head is None:
            return None
        reader = _Reader(body, head.end())
        try:
            arguments = reader.value()
        except (ValueError, RecursionError):
            return None
        if not isinstance(arguments, dict) or body[reader.pos :].strip():
            return None
        return [(head["name"], arguments)]

    @staticmethod
    def forced_format(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
        """Calls back to back. The template writes an object's keys sorted (Jinja's
        dictsort), xgrammar in the schema's order: the schema goes in with sorted keys. A null
        is xgrammar's `null`, where the template, through Jinja, writes `None`."""
        # The template writes no whitespace between tokens; xgrammar allows some at every seam,
        # where more than one character would only let a weak model wander.
        tight = ArgsFormat(1)
        calls = [
            seq(
                const(f"{CALL_OPEN}call:{name}"),
                tight(sorted_properties(schema), style="gemma"),
                const(CALL_CLOSE),
            )
            for name, schema in functions
        ]
        return joined(either(calls), "", many)


class _Reader:
    """Reads one value of Gemma's notation from `text` at `pos`; ValueError when malformed."""

    def __init__(self, text: str, pos: int) -> None:
        self.text = text
        self.pos = pos

    def value(self) -> Any:
        self._space()
        text, pos = self.text, self.pos
        if text.startswith("{", pos):
            return self._object()
        if text.startswith("[", pos):
            return self._array()
        if text.startswith(QUOTE, pos) or text.startswith('"', pos):
            return self._string()
        return self._scalar()

    def _object(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.pos += 1
        if self._closes("}"):
            return out
        while True:
            key = self._key()
            self._expect(":")
            out[key] = self.value()
            if self._closes("}"):
                return out
            self._expect(",")

    def _array(self) -> list[Any]:
        out: list[Any] = []
        self.pos += 1
        if self._closes("]"):
            return out
        while True:
            out.append(self.value())
            if self._closes("]"):
                return out
            self._expect(",")

    def _key(self) -> str:
        self._space()
        if self.text.startswith(QUOTE, self.pos) or self.text.startswith('"', self.pos):
            return self._string()
        return self._match(_KEY)

    def _string(self) -> str:
        text, pos = self.text, self.pos
        if text.startswith(QUOTE, pos):
            end = text.find(QUOTE, pos + len(QUOTE))
            if end == -1:
                raise ValueError("unterminated string")
            self.pos = end + len(QUOTE)
            return text[pos + len(QUOTE) : end]  # raw: the notation has no escapes
        value, self.pos = json.JSONDecoder().raw_decode(text, pos)
        if not isinstance(value, str):
            raise ValueError("not a string")
        return value

    def _scalar(self) -> Any:
        number = _NUMBER.match(self.text, self.pos)
        word = number or _WORD.match(self.text, self.pos)
        if word is None or not _ENDS_VALUE.match(self.text, word.end()):
            raise ValueError("not a value")  # e.g. a bare word, or `trueish`
        self.pos = word.end()
        return json.loads(word[0]) if number else _WORDS[word[0]]

    def _match(self, pattern: re.Pattern[str]) -> str:
        match = pattern.match(self.text, self.pos)
        if match is None:
            raise ValueError(f"expected {pattern.pattern}")
        self.pos = match.end()
        return match[0]

    def _expect(self, char: str) -> None:
        self._space()
        if not self.text.startswith(char, self.pos):
            raise ValueError(f"expected {char!r}")
        self.pos += 1

    def _closes(self, char: str) -> bool:
        self._space()
        if self.text.startswith(char, self.pos):
            self.pos += 1
            return True
        return False

    def _space(self) -> None:
        text = self.text
        while self.pos < len(text) and text[self.pos].isspace():
            self.pos += 1


def sorted_properties(schema: Any) -> Any:
    """`schema` with every object's `properties` in key order, nested schemas included."""
    if isinstance(schema, list):
        return [sorted_properties(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    properties = schema.get("properties")
    if isinstance(properties, dict):
        out["properties"] = {k: sorted_properties(properties[k]) for k in sorted(properties)}
    for key in _SUBSCHEMAS:
        if key in schema:
            out[key] = sorted_properties(schema[key])
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {k: sorted_properties(v) for k, v in schema[key].items()}
    return out
