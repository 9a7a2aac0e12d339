"""Kimi K2 tool calls (Kimi-K2-Instruct, Kimi-K2-Thinking): one section of calls, each an id
and JSON arguments, all markers control tokens:

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>
    <|tool_call_begin|>functions.NAME:1<|tool_call_argument_begin|>{...}<|tool_call_end|>
    <|tool_calls_section_end|>

The id the model writes, `functions.NAME:IDX`, names the function and is the call's id: Kimi's
templates write the calls of the history and the results that answer them with these ids
(`## Return of functions.NAME:IDX`), so the id a client gets, and sends back with the result,
is the text the model wrote. The `functions.` prefix may be missing; the index may not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from localradix.parsers.block_calls import BlockToolParser, Call
from localradix.parsers.events import IdFactory
from localradix.parsers.structural_tag import ArgsFormat, Format, Function, const, either, seq, star

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGS_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

_ID = re.compile(r"(?:functions\.)?(?P<name>[^\s:<>]+):\d+")
# The index the model writes: per message in one template, counted over the conversation in
# the others, so any number.
_INDEX = {"type": "regex", "pattern": r"(0|[1-9][0-9]{0,5})"}


class KimiK2ToolParser(BlockToolParser):
    name = "kimi-k2"
    markers = (SECTION_BEGIN,)
    end = SECTION_END
    special_markers = (SECTION_BEGIN, CALL_BEGIN, ARGS_BEGIN, CALL_END, SECTION_END)

    def __init__(
        self,
        tool_names: Collection[str] | None = None,
        id_factory: IdFactory | None = None,
        *,
        complete_calls: bool = False,
        tool_schemas: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            tool_names, id_factory, complete_calls=complete_calls, tool_schemas=tool_schemas
        )
        # Every call the base commits takes its id from here: the ids of the block just read,
        # in order (the factory only if a block ever had fewer ids than calls).
        self._factory_id = self._new_id
        self._block_ids: list[str] = []
        self._new_id = self._written_id

    def read_calls(self, body: str) -> list[Call] | None:
        first, *items = body.split(CALL_BEGIN)
        if first.strip() or not items:
            return None
        calls: list[Call] = []
        ids: list[str] = []
        for item in items:
            item = item.rstrip()
            call = _call(item[: -len(CALL_END)]) if item.endswith(CALL_END) else None
            if call is None:
                return None
            call_id, name, arguments = call
            ids.append(call_id)
            calls.append((name, arguments))
        self._block_ids = ids
        return calls

    def _written_id(self) -> str:
        return self._block_ids.pop(0) if self._block_ids else self._factory_id()

    @staticmethod
    def forced_format(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
        calls = either(
            [
                seq(
                    const(f"{CALL_BEGIN}functions.{name}:"),
                    _INDEX,
                    const(ARGS_BEGIN),
                    args(schema),
                    const(CALL_END),
                )
                for name, schema in functions
            ]
        )
        body = seq(calls, star(calls)) if many else calls
        return seq(const(SECTION_BEGIN), body, const(SECTION_END))


def _call(text: str) -> tuple[str, str, str] | None:
    """`functions.NAME:IDX<|tool_call_argument_begin|>{json}` -> (id, name, arguments)."""
    head, sep, arguments = text.partition(ARGS_BEGIN)
    call_id = head.strip()
    match = _ID.fullmatch(call_id)
    arguments = arguments.strip()
    if not sep or match is None or not _is_object(arguments):
        return None
    return call_id, match["name"], arguments  # the arguments as the model wrote them


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
