"""Qwen3-Coder dialect (also Qwen3.5 / 3.6, Nemotron 3 Nano, StepFun 3.5): XML-style calls.

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

The templates write one call per block, parallel calls as several blocks joined by a newline
(by nothing in StepFun's template); a block holding several `<function=` calls is read too. The templates write a VALUE between a newline after `<parameter=KEY>` and
one before `</parameter>`: those two newlines are the format's, not the value's. Strings are
written raw, objects and arrays with `tojson`, everything else with Jinja's `string` (so
booleans and null are `True` / `False` / `None`); `param_value` types them back by the
function's schema. A `</parameter>` that is not followed by the next parameter or by
`</function>` is part of the value (JSON or code that contains the text).

Hermes' JSON calls share the `<tool_call>` marker: a block that is not `<function=...>` blocks
is not a call of this dialect and stays content.

Forced calls (`forced_format`) use xgrammar's "qwen_xml" argument style, which writes
booleans and null as JSON does; the grammar writes them as the template does instead (see
`_as_written`), and the parser reads both.

The helpers at the end (`xml_value`, `value_end`, `is_name`) serve the GLM and MiniMax
dialects too.
"""

from __future__ import annotations

from typing import Any

from localradix.parsers.block_calls import (
    BlockToolParser,
    Call,
    XmlCalls,
    read_sequence,
)
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

FUNCTION = "<function="
PARAMETER = "<parameter="
END_FUNCTION = "</function>"
END_PARAMETER = "</parameter>"


class Qwen3CoderToolParser(BlockToolParser):
    name = "qwen3-coder"
    markers = ("<tool_call>",)
    end = "</tool_call>"
    # Plain added tokens in Qwen's vocabularies, but listed anyway: a marker that decoding
    # shows already costs nothing (the tokenizer manager skips it), one a model marks special
    # would otherwise vanish before the parser sees it.
    special_markers = ("<tool_call>", "</tool_call>")

    def read_calls(self, body: str) -> list[Call] | None:
        return read_sequence(body, lambda text: CALLS.read(text, self._schema))

    @staticmethod
    def forced_format(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
        """`<tool_call>` blocks as the templates write them, each optionally after a newline
        (Qwen3-Coder and Nemotron write one before every block, StepFun none)."""
        calls = [
            seq(
                const(f"<tool_call>\n<function={name}>\n"),
                args(_as_written(schema), style="qwen_xml"),  # ends in optional whitespace
                const(f"{END_FUNCTION}\n</tool_call>"),
            )
            for name, schema in functions
        ]
        return joined(seq(optional(const("\n")), either(calls)), "", many)


def _tag_value(text: str, opening: str) -> tuple[str, str] | None:
    """`<opening>VALUE>` at the start of `text` (e.g. `<function=NAME>`): VALUE and the rest."""
    close = text.find(">", len(opening))
    if not text.startswith(opening) or close == -1:
        return None
    value = text[len(opening) : close]
    if "<" in value or "\n" in value:  # the `>` of a later tag: this one never closed
        return None
    return value, text[close + 1 :]


def _unwrap(text: str) -> str:
    """A value without the newline the template writes on each side of it."""
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text


# Jinja's `string` writes these as Python does.
_PYTHON_VALUES: dict[str, tuple[Any, ...]] = {"boolean": (True, False), "null": (None,)}


def _as_written(schema: dict[str, Any]) -> dict[str, Any]:
    """The parameters schema with each top-level boolean or null value as the template writes
    it (`True`, `False`, `None`: xgrammar's qwen_xml style writes JSON's `true`...). Nested
    values are JSON (`tojson`) and stay as they are."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return schema
    return {**schema, "properties": {k: _python_scalar(v) for k, v in properties.items()}}


def _python_scalar(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if isinstance(kind, list) and any(k in _PYTHON_VALUES for k in kind):
        rest = {k: v for k, v in schema.items() if k != "type"}
        return {"anyOf": [_python_scalar({**rest, "type": k}) for k in kind]}
    if isinstance(kind, str) and kind in _PYTHON_VALUES:
        return {"enum": [str(v) for v in _PYTHON_VALUES[kind] if _allows(schema, v)]}
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return {**schema, key: [_python_scalar(s) for s in schema[key]]}
    return schema


def _allows(schema: dict[str, Any], value: Any) -> bool:
    """Whether the schema's `const` / `enum` (if any) admit `value` (by identity: 1 is not
    True)."""
    if "const" in schema:
        return schema["const"] is value
    return "enum" not in schema or any(v is value for v in schema["enum"])


# How this dialect writes its calls (below the tag reader it uses).
CALLS = XmlCalls(FUNCTION, END_FUNCTION, PARAMETER, END_PARAMETER, _tag_value, _unwrap)
