"""Building blocks of xgrammar structural tags (plain dicts), shared by every dialect's forced
tool-call format: `tool_constraint` assembles them, and a dialect module may define its own
format from them (`forced_format`, see `tool_constraint`)."""

from __future__ import annotations

from typing import Any

Format = dict[str, Any]
Function = tuple[str, dict[str, Any]]  # (name, parameters schema)


def const(text: str) -> Format:
    return {"type": "const_string", "value": text}


def seq(*elements: Format) -> Format:
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": list(elements)}


def either(elements: list[Format]) -> Format:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}


def optional(content: Format) -> Format:
    return {"type": "optional", "content": content}


def star(content: Format) -> Format:
    return {"type": "star", "content": content}


def joined(item: Format, separator: str, many: bool) -> Format:
    """`item`, or with `many` one or more of it joined by `separator`."""
    if not many:
        return item
    rest = seq(const(separator), item) if separator else item
    return seq(item, star(rest))


class ArgsFormat:
    """A function's arguments matching its schema; `style` is xgrammar's name for how they are
    written ("json", or an XML style such as "qwen_xml", "glm_xml", "minimax_xml", "gemma")."""

    def __init__(self, max_whitespace: int | None) -> None:
        self.max_whitespace = max_whitespace

    def __call__(self, schema: dict[str, Any] | bool, style: str = "json") -> Format:
        fmt: Format = {"type": "json_schema", "json_schema": schema}
        if style != "json":
            fmt["style"] = style
        if self.max_whitespace is not None:
            fmt["max_whitespace_cnt"] = self.max_whitespace
        return fmt
