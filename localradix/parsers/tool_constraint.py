"""The grammar that forces tool calls for `tool_choice="required"` or a named function.

The result is an xgrammar structural tag (`Constraint("structural_tag", spec)`): the output must
be exactly the chosen dialect's wire format for one call (or, for "required" with
`parallel_tool_calls`, one or more), each call's arguments matching that function's
`parameters` JSON schema (xgrammar strict mode: no properties beyond the schema's), and nothing
after the last call but one optional newline and the end of sequence: a model may stop after
any complete call, also where it writes the newline that would begin another one. Formats per
dialect (NAME is JSON-escaped):

- hermes:      `<tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>`, joined by "\\n"
- llama3:      `{"name": "NAME", "parameters": ARGS}`, joined by "; "
- mistral:     `[TOOL_CALLS][{"name": "NAME", "arguments": ARGS}, ...]`
- mistral-v11: `[TOOL_CALLS]NAME[ARGS]ARGS`, repeated
- pythonic:    `[NAME(key=VALUE, ...), ...]`: required keys first, then optional ones, in the
  schema's order; values are JSON (the parser reads true/false/null too)

With `reasoning` (a reasoning dialect name) the calls may follow a reasoning block, required
when the prompt already opened it (`starts_in_reasoning`), optional otherwise. harmony's format
(gpt-oss) carries its own optional analysis message instead (see `parsers.harmony`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from localradix.parsers.reasoning import get_reasoning_parser
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
from localradix.parsers.tool_calls import TOOL_PARSERS, get_tool_parser
from localradix.sampling_params import Constraint

FormatBuilder = Callable[[list[Function], bool, ArgsFormat], Format]

# Longest whitespace run allowed between JSON tokens: room for pretty-printed arguments, but no
# endless newlines from a small model that the grammar would otherwise let through.
MAX_WHITESPACE = 20


class ToolChoiceError(ValueError):
    """The request's tools / tool_choice cannot be constrained; the message says why (a 400)."""


def tool_call_constraint(
    tools: Sequence[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    dialect: str,
    parallel: bool = True,
    *,
    reasoning: str | None = None,
    starts_in_reasoning: bool = False,
    max_whitespace: int | None = MAX_WHITESPACE,
) -> Constraint | None:
    """The constraint for `tool_choice`, or None when nothing is forced ("auto", "none", None).

    "required": one call of any of the functions, or one or more when `parallel`; a named
    choice (`{"type": "function", "function": {"name": ...}}`): exactly one call of it.
    Raises ToolChoiceError for an unknown dialect, a missing function, or no functions.
    """
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    functions = _functions(tools)
    if tool_choice == "required":
        if not functions:
            raise ToolChoiceError('tool_choice "required" needs at least one function in tools')
        chosen, many = functions, parallel
    else:
        chosen, many = [_named(functions, tool_choice)], False
    build = _format_builder(dialect)
    args = ArgsFormat(max_whitespace)
    fmt = seq(build(chosen, many, args), optional(const("\n")))  # then EOS
    if reasoning is not None:
        fmt = seq(_reasoning_prefix(reasoning, starts_in_reasoning), fmt)
    return Constraint("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}))


# ---- tools and choice ------------------------------------------------------------------------


def _functions(tools: Sequence[dict[str, Any]] | None) -> list[Function]:
    out: list[Function] = []
    for tool in tools or ():
        if tool.get("type", "function") != "function" or not isinstance(tool.get("function"), dict):
            continue
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ToolChoiceError("every function in tools needs a name")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise ToolChoiceError(f"the parameters of {name!r} must be a JSON schema object")
        out.append((name, parameters))
    return out


def _named(functions: list[Function], tool_choice: str | dict[str, Any]) -> Function:
    name = None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else tool_choice.get("name")
    if not isinstance(name, str):
        raise ToolChoiceError(
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}'
        )
    for function in functions:
        if function[0] == name:
            return function
    raise ToolChoiceError(f"tool_choice names the function {name!r}, which is not in tools")


# ---- dialects --------------------------------------------------------------------------------


def _hermes(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
    calls = [
        seq(
            const(f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": '),
            args(schema),
            const("}\n</tool_call>"),
        )
        for name, schema in functions
    ]
    return joined(either(calls), "\n", many)


def _llama3(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
    calls = [
        seq(const(f'{{"name": {json.dumps(name)}, "parameters": '), args(schema), const("}"))
        for name, schema in functions
    ]
    return joined(either(calls), "; ", many)


def _mistral(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
    calls = [
        seq(const(f'{{"name": {json.dumps(name)}, "arguments": '), args(schema), const("}"))
        for name, schema in functions
    ]
    return seq(const("[TOOL_CALLS]["), joined(either(calls), ", ", many), const("]"))


def _mistral_v11(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
    calls = [seq(const(f"[TOOL_CALLS]{name}[ARGS]"), args(schema)) for name, schema in functions]
    return joined(either(calls), "", many)


def _pythonic(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
    calls = [_python_call(name, schema, args) for name, schema in functions]
    return seq(const("["), joined(either(calls), ", ", many), const("]"))


def _python_call(name: str, schema: dict[str, Any], args: ArgsFormat) -> Format:
    properties = schema.get("properties") or {}
    if not isinstance(properties, dict) or not all(k.isidentifier() for k in properties):
        raise ToolChoiceError(f"the parameters of {name!r} cannot be Python keyword arguments")
    if not properties:
        return const(f"{name}()")
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    required = [k for k in properties if k in set(schema.get("required") or ())]
    optional_keys = [k for k in properties if k not in required]

    def keyword(key: str) -> Format:
        sub = properties[key]
        sub = {**defs, **sub} if isinstance(sub, dict) else sub
        return seq(const(f"{key}="), args(sub))

    def after(keys: list[str]) -> list[Format]:
        return [optional(seq(const(", "), keyword(k))) for k in keys]

    if required:
        first = [keyword(required[0])]
        rest = [seq(const(", "), keyword(k)) for k in required[1:]]
        body = seq(*first, *rest, *after(optional_keys))
    else:  # the first optional keyword present carries no comma
        starts = [
            seq(keyword(k), *after(optional_keys[i + 1 :])) for i, k in enumerate(optional_keys)
        ]
        body = optional(either(starts))
    return seq(const(f"{name}("), body, const(")"))


_DIALECTS: dict[str, FormatBuilder] = {
    "hermes": _hermes,
    "llama3": _llama3,
    "mistral": _mistral,
    "mistral-v11": _mistral_v11,
    "pythonic": _pythonic,
}


def _format_builder(dialect: str) -> FormatBuilder:
    """The dialect's wire format for forced calls: the table above, or its parser class's
    `forced_format` static method (the dialects that live in their own module)."""
    dialect = TOOL_PARSERS.aliases.get(dialect, dialect)
    if dialect in _DIALECTS:
        return _DIALECTS[dialect]
    build = (
        getattr(get_tool_parser(dialect), "forced_format", None)
        if dialect in TOOL_PARSERS
        else None
    )
    if build is None:
        raise ToolChoiceError(f"no tool-call grammar for the dialect {dialect!r}")
    return build


def _reasoning_prefix(name: str, starts_in_reasoning: bool) -> Format:
    try:
        dialect = get_reasoning_parser(name)
    except KeyError as exc:
        raise ToolChoiceError(str(exc.args[0])) from None
    block: Format = {
        "type": "tag",
        "begin": "" if starts_in_reasoning else dialect.start,
        "content": {"type": "any_text"},
        "end": dialect.end,
    }
    after = const(dialect.resume) if dialect.resume else {"type": "regex", "pattern": r"[ \n]{0,4}"}
    block = seq(block, after)
    if starts_in_reasoning:
        return block
    # A model may open its block after a newline (GLM-4.6's template writes "\n<think>").
    return optional(seq({"type": "regex", "pattern": r"\n?"}, block))
