"""Pythonic dialect: `[get_weather(city="Paris"), get_time()]` (Llama 3.2 / Llama 4 pythonic
templates, ToolACE and other fine-tunes).

The list opens a region when it starts the output, or after `<|python_start|>` (Llama 4; then
`<|python_end|>` may close it). Arguments are keyword arguments with Python or JSON literal
values (`True`/`true`, `None`/`null`, strings, numbers, lists, dicts), sent as one JSON object
once each call's closing parenthesis arrives.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from typing import Any

from localradix.parsers.tool_stream import Region, ToolCallStreamParser

END = "<|python_end|>"
_OPENING = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_OPENING_PREFIX = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?")
_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


class PythonicToolParser(ToolCallStreamParser):
    name = "pythonic"
    markers = ("<|python_start|>",)

    def _start_trigger(self, text: str, final: bool) -> bool | None:
        if _OPENING.match(text):
            return True
        return None if _OPENING_PREFIX.fullmatch(text) else False

    def _region_step(self, region: Region, final: bool) -> bool:
        state = region.state
        if state == "call":  # the scanner sees every character, whitespace included
            return self._call_step(region)
        if not self._skip_ws(region):
            return False
        if state == "start":
            if self._buf[0] != "[":
                return self._reject_call(region)
            self._take(region, 1)
            region.state = "item"
        elif state == "item":
            self._begin_call(region)
            region.extra["scan"] = _CallScanner()
            region.state = "call"
        elif state == "after":
            return self._after_step(region)
        else:  # "end": after "]"
            if self._buf.startswith(END):
                self._take(region, len(END))
            elif region.marker and END.startswith(self._buf) and not final:
                return False
            return self._close(region, ok=True)
        return True

    def _call_step(self, region: Region) -> bool:
        scan = region.extra["scan"]
        assert isinstance(scan, _CallScanner)
        consumed = scan.feed(self._buf)
        self._take(region, consumed)
        if scan.error:
            return self._reject_call(region)
        if not scan.done:
            return consumed > 0
        call = parse_call(region.raw[region.call_start :])
        if call is None:
            return self._reject_call(region)
        index = self._commit(region, call[0])
        if index is None:
            return self._reject_call(region)
        self._send_args(index, call[1])
        self._call_done(region)
        region.state = "after"
        return True

    def _after_step(self, region: Region) -> bool:
        separator = self._buf[0]
        if separator not in ",]":
            return self._close(region, ok=True)
        self._take(region, 1)
        region.state = "item" if separator == "," else "end"
        return True


class _CallScanner:
    """Finds the end of `name(...)`: tracks brackets and quoted strings."""

    def __init__(self) -> None:
        self.done = False
        self.error = False
        self._phase = "name"  # name -> args
        self._seen_name = False
        self._depth = 0
        self._quote = ""
        self._escape = False

    def feed(self, text: str) -> int:
        for i, ch in enumerate(text):
            if self._phase == "name":
                self._name_char(ch)
            else:
                self._args_char(ch)
            if self.error:
                return i
            if self.done:
                return i + 1
        return len(text)

    def _name_char(self, ch: str) -> None:
        if ch == "(" and self._seen_name:
            self._phase, self._depth = "args", 1
        elif ch.isalpha() or ch == "_" or (self._seen_name and (ch.isdigit() or ch == ".")):
            self._seen_name = True
        elif not ch.isspace():
            self.error = True

    def _args_char(self, ch: str) -> None:
        if self._quote:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == self._quote:
                self._quote = ""
        elif ch in "'\"":
            self._quote = ch
        elif ch in "([{":
            self._depth += 1
        elif ch in ")]}":
            self._depth -= 1
            self.done = self._depth == 0


def parse_call(text: str) -> tuple[str, str] | None:
    """`name(k=v, ...)` -> (name, arguments as JSON text); None when it is not such a call."""
    try:
        with warnings.catch_warnings():  # a model's "C:\dir" would warn of an invalid escape
            warnings.simplefilter("ignore")
            node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or node.args:
            return None
        arguments = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                return None
            arguments[keyword.arg] = _literal(keyword.value)
        return _dotted(node.func), json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (SyntaxError, ValueError, TypeError, RecursionError):
        return None


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    raise ValueError("not a function name")


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise ValueError("** in a dict")
        return {str(_literal(k)): _literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    value = ast.literal_eval(node)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise ValueError(f"unsupported literal {type(value).__name__}")
