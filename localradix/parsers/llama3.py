"""Llama 3.1 / 3.2 / 3.3 JSON dialect: `{"name": ..., "parameters": {...}}`.

The call is the whole output: it opens when the output starts with `{` (after whitespace) or at
`<|python_tag|>` (visible only when special tokens are kept). Several calls are separated by
`;`. An output that starts with `{` but is not a call object (its first key is not one of
name / parameters / arguments / type) is content, decided as soon as that key is read.
"""

from __future__ import annotations

from localradix.parsers.tool_stream import Region, ToolCallStreamParser


class Llama3JsonToolParser(ToolCallStreamParser):
    name = "llama3"
    markers = ("<|python_tag|>",)

    def _start_trigger(self, text: str, final: bool) -> bool | None:
        return text.startswith("{")

    def _region_step(self, region: Region, final: bool) -> bool:
        if region.state in ("start", "call"):
            if region.obj is None and not self._skip_ws(region):
                return False
            return self._object_step(region)
        if not self._skip_ws(region):
            return False
        if region.state == "after":
            if self._buf[0] != ";":
                return self._close(region, ok=True)
            self._take(region, 1)
            region.state = "next"
            return True
        self._begin_call(region)  # after ";": the next call or the end of the region
        region.state = "call"
        return True
