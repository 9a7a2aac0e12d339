"""Dialects whose calls sit in a delimited block that is read whole: the base of the XML and
special-token formats (Qwen3-Coder, GLM, MiniMax, DeepSeek, Kimi, Gemma 4, ...).

A block opens at one of `markers` and closes at `end`. Until `end` arrives the block is held;
then `read_calls(body)` turns its text into calls. A block that does not read as calls goes back
to content, marker and all (never lost, never half a call). A block the output cuts off before
its `end` is dropped with `complete_calls` (what the server uses), else it stays content. The
whole call is sent in one delta once its block is complete: these formats have no JSON prefix
that could be streamed argument by argument.

Values of XML-style parameters are text; `param_value` types them by the function's JSON
schema (`tool_schemas`), as the templates that write them do: strings raw, the rest as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from localradix.parsers.json_scan import WHITESPACE
from localradix.parsers.tool_stream import Region, ToolCallStreamParser

Call = tuple[str, Any]  # (name, arguments: a JSON-able object, or JSON text)


class BlockToolParser(ToolCallStreamParser):
    end = ""  # closes a block

    def read_calls(self, body: str) -> list[Call] | None:
        """The calls one block's text (between its marker and `end`) holds, in order; None
        when it is not a well-formed block of calls."""
        raise NotImplementedError

    def _region_step(self, region: Region, final: bool) -> bool:
        index = self._buf.find(self.end)
        if index == -1:
            return False  # at the end of output the base drops (or restores) the open block
        calls = self.read_calls(self._buf[:index])
        if not calls or not all(self._allowed(name) for name, _ in calls):
            return self._reject_call(region)
        self._take(region, index + len(self.end))
        for name, arguments in calls:
            call = self._commit(region, name)
            assert call is not None  # every name was checked above
            self._send_args(call, arguments_text(arguments))
            self._call_done(region)
        return self._close(region, ok=True)

    def _end_region(self, region: Region) -> None:
        # The open block's text is still in the buffer: it belongs to the region, so that a
        # block the output cut off is dropped whole (complete_calls) or restored whole.
        self._take(region, len(self._buf))
        super()._end_region(region)

    def _allowed(self, name: str) -> bool:
        return bool(name) and (self._tool_names is None or name in self._tool_names)

    def _schema(self, function: str, parameter: str) -> Any:
        """The JSON schema of `function`'s `parameter` (None when unknown)."""
        properties = (self._tool_schemas.get(function) or {}).get("properties")
        return properties.get(parameter) if isinstance(properties, dict) else None


Tag = Callable[[str, str], tuple[str, str] | None]  # (text, opening) -> (name, rest)


@dataclass(frozen=True)
class XmlCalls:
    """A dialect of XML-style calls: `<call NAME>` then parameters `<parameter KEY>VALUE
    </parameter>` then `</call>`, whitespace between the tags. `tag` reads the name in one of
    its opening tags and the text after it; `unwrap` takes the format's own text off a value
    (None: the value is all the text between its tags)."""

    call: str
    end_call: str
    parameter: str
    end_parameter: str
    tag: Tag
    unwrap: Callable[[str], str] | None = None

    def read(self, text: str, schema: Callable[[str, str], Any]) -> tuple[Call, str] | None:
        """The call at the start of `text` and the text after it; values typed by
        `schema(function, parameter)`."""
        header = self.tag(text, self.call)
        if header is None or not is_name(header[0]):
            return None
        name, rest = header
        arguments: dict[str, Any] = {}
        while True:
            rest = rest.lstrip(WHITESPACE)
            if rest.startswith(self.end_call):
                return (name, arguments), rest[len(self.end_call) :]
            read = self._parameter(rest, name, schema)
            if read is None:
                return None
            key, arguments[key], rest = read

    def _parameter(
        self, text: str, function: str, schema: Callable[[str, str], Any]
    ) -> tuple[str, Any, str] | None:
        header = self.tag(text, self.parameter)
        if header is None or not header[0]:
            return None
        key, rest = header
        end = value_end(rest, 0, self.end_parameter, (self.parameter, self.end_call))
        if end == -1:
            return None
        raw = rest[:end] if self.unwrap is None else self.unwrap(rest[:end])
        return key, param_value(raw, schema(function, key)), rest[end + len(self.end_parameter) :]


def read_sequence(
    body: str, read_one: Callable[[str], tuple[Call, str] | None]
) -> list[Call] | None:
    """The calls `read_one` reads one after another from `body` (whitespace between them);
    None when any part is not a call."""
    calls: list[Call] = []
    rest = body.lstrip(WHITESPACE)
    while rest:
        read = read_one(rest)
        if read is None:
            return None
        calls.append(read[0])
        rest = read[1].lstrip(WHITESPACE)
    return calls


def arguments_text(arguments: Any) -> str:
    """A call's arguments as the JSON text OpenAI's `function.arguments` carries."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def is_name(name: str) -> bool:
    """Whether `name` can be a function name: no whitespace, tags or JSON punctuation (a
    JSON call, which other dialects put in the same tags, is not a name)."""
    return bool(name) and not any(c.isspace() or c in '<>"{}[]' for c in name)


def param_value(text: str, schema: Any) -> Any:
    """An XML-style parameter's text as the value its schema asks for (see `_typed_value`); a
    string from a fixed set (`enum`, `const`) is read without the
    whitespace around it: xgrammar's XML styles allow whitespace around every value that is
    not free text, and a model under a forced grammar may well write some."""
    stripped = text.strip(WHITESPACE)
    choices = _choices(schema)
    if stripped != text and stripped in choices and text not in choices:
        return stripped
    return _typed_value(text, schema)


def _choices(schema: Any) -> list[Any]:
    if not isinstance(schema, dict):
        return []
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return enum if isinstance(enum, list) else []


def value_end(text: str, start: int, close: str, follows: tuple[str, ...]) -> int:
    """Where the parameter value that begins at `start` ends: at the first `close` followed,
    after whitespace, by one of `follows` or by the end of `text`; a `close` followed by
    anything else is inside the value. -1 when there is none."""
    index = text.find(close, start)
    while index != -1:
        after = text[index + len(close) :].lstrip(WHITESPACE)
        if not after or after.startswith(follows):
            return index
        index = text.find(close, index + 1)
    return -1


def _typed_value(text: str, schema: Any) -> Any:
    """An XML-style parameter's text as the value its schema asks for: strings stay text,
    anything else is read as JSON (or Python's True/False/None, which Jinja's `string` filter
    writes); what does not parse stays text."""
    if _wants_string(schema):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return _PYTHON_LITERALS.get(text.strip(), text)


_PYTHON_LITERALS: Mapping[str, Any] = {"True": True, "False": False, "None": None}


def _wants_string(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and kind and kind[0] == "string"):
        return True
    return "enum" in schema and all(isinstance(v, str) for v in schema["enum"] or [None])
