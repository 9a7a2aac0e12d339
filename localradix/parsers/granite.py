"""Granite 3.x tool calls: the `<|tool_call|>` control token, then a JSON list of calls:

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]

(a single object is read too). The list is read as Mistral's JSON layout is, streaming each
call's arguments as they arrive. Granite 3.3's chat template tells the model this format in its
system prompt but never writes a call back into the history. Granite 4 writes hermes'
`<tool_call>` instead (the "granite4" alias).
"""

from __future__ import annotations

import json

from localradix.parsers.events import new_call_id
from localradix.parsers.mistral import MistralToolParser
from localradix.parsers.structural_tag import (
    ArgsFormat,
    Format,
    Function,
    const,
    either,
    joined,
    seq,
)
from localradix.parsers.tool_stream import Region

TOOL_CALL = "<|tool_call|>"


class GraniteToolParser(MistralToolParser):
    name = "granite"
    markers = (TOOL_CALL,)
    special_markers = (TOOL_CALL,)
    # Mistral's nine-character ids are a rule of Mistral's templates only.
    default_id_factory = staticmethod(new_call_id)

    def _step_start(self, region: Region, final: bool) -> bool:
        # Only the JSON layout: Mistral's `name[ARGS]{...}` is no Granite format.
        if not self._skip_ws(region):
            return False
        if self._buf[0] not in "[{":
            return self._reject_call(region)
        return super()._step_start(region, final)

    @staticmethod
    def forced_format(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
        calls = [
            seq(const(f'{{"name": {json.dumps(name)}, "arguments": '), args(schema), const("}"))
            for name, schema in functions
        ]
        return seq(const(f"{TOOL_CALL}["), joined(either(calls), ", ", many), const("]"))
