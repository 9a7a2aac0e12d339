"""Generic dialect: the reply format the server teaches a model whose chat template has no tools
section (`loader/tool_prompt.py` writes the tools and this format into the prompt).

A reply is plain text, or calls as one JSON object:

    {"tool_calls": [{"name": "NAME", "arguments": {...}}, ...]}

It is read where the output starts with `{` (after whitespace, also inside a ```` ```json ````
fence) and wherever the content reaches `{"tool_calls"`. At the start, a bare call object
`{"name": ..., "arguments": ...}` is read too: small models drop the wrapper. Anything else (a
JSON answer whose first key is no call's, a name not in the tools) stays content.
"""

from __future__ import annotations

import json

from localradix.parsers.json_scan import WHITESPACE
from localradix.parsers.structural_tag import (
    ArgsFormat,
    Format,
    Function,
    const,
    either,
    joined,
    seq,
)
from localradix.parsers.tool_stream import Region, ToolCallStreamParser

KEY = '"tool_calls"'
MARKER = "{" + KEY
OPEN = ("{", KEY, ":", "[")  # the wrapper up to its first call, whitespace allowed between
CLOSE = ("]", "}")
FENCE, JSON_FENCE = "```", "```json"


class GenericToolParser(ToolCallStreamParser):
    name = "generic"
    markers = (MARKER,)
    special_markers = ()  # plain text: no special tokens to keep

    @staticmethod
    def forced_format(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
        """`{"tool_calls": [CALL, ...]}`, each CALL `{"name": "NAME", "arguments": ARGS}`."""
        calls = [
            seq(const(f'{{"name": {json.dumps(name)}, "arguments": '), args(schema), const("}"))
            for name, schema in functions
        ]
        return seq(const('{"tool_calls": ['), joined(either(calls), ", ", many), const("]}"))

    def _start_trigger(self, text: str, final: bool) -> bool | None:
        if text.startswith("{"):
            return True
        fenced = [_match(text, (fence, "{"))[1] for fence in (JSON_FENCE, FENCE)]
        return True if True in fenced else (None if None in fenced else False)

    def _region_step(self, region: Region, final: bool) -> bool:
        if region.state == "start":
            return self._open(region)
        if region.state in ("list", "call"):
            return self._call(region)
        if region.state == "after":
            return self._after_call(region)
        return self._end(region, final)

    def _open(self, region: Region) -> bool:
        """The fence, then the wrapper up to `[` (or, at the start, a bare call object)."""
        if not region.marker and self._buf.startswith(FENCE):
            # The start trigger saw the whole fence and the `{` after it.
            self._take(region, len(JSON_FENCE if self._buf.startswith(JSON_FENCE) else FENCE))
            self._skip_ws(region)
            region.extra["fence"] = True
            return True
        end, status = _match(self._buf, OPEN[2:] if region.marker else OPEN)
        if status is None:
            return False
        if status:
            self._take(region, end)
            self._next_call(region)
            return True
        if region.marker:  # `{"tool_calls"` in the content, not followed by `: [`
            return self._reject_call(region)
        region.extra["bare"] = True
        region.state = "call"
        return True

    def _call(self, region: Region) -> bool:
        if region.obj is None:
            if not self._skip_ws(region):
                return False
            if self._buf[0] == "]" and region.calls:  # a trailing comma: the list ends
                region.state = "end"
                return True
        return self._object_step(region)

    def _after_call(self, region: Region) -> bool:
        if region.extra.get("bare"):
            region.state = "end"
            return True
        if not self._skip_ws(region):
            return False
        if self._buf[0] == ",":
            self._take(region, 1)
            self._next_call(region)
        else:
            region.state = "end"
        return True

    def _end(self, region: Region, final: bool) -> bool:
        """`]}` and the fence's close, each taken when there; whatever follows is content."""
        steps: tuple[str, ...] = () if region.extra.get("bare") else CLOSE
        steps += (FENCE,) if region.extra.get("fence") else ()
        end, status = _match(self._buf, steps)
        if status is None and not final:
            return False
        self._take(region, end)
        return self._close(region, ok=True)

    def _next_call(self, region: Region) -> None:
        region.state = "list"
        self._begin_call(region)


def _match(text: str, steps: tuple[str, ...]) -> tuple[int, bool | None]:
    """Match `steps` (literals, whitespace allowed before each) at the start of `text`: the end
    of the last step matched whole, and True (all matched), False (one differs) or None (the
    text ends before it is decided)."""
    pos = end = 0
    for step in steps:
        while pos < len(text) and text[pos] in WHITESPACE:
            pos += 1
        rest = text[pos:]
        if rest.startswith(step):
            pos = end = pos + len(step)
        elif step.startswith(rest):
            return end, None
        else:
            return end, False
    return end, True
