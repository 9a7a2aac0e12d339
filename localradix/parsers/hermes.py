"""Hermes / Qwen dialect: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.

Used by Qwen2.5, Qwen3, QwQ, Hermes 2 Pro / 3 and many fine-tunes. Each `<tool_call>` block holds
one JSON object; several blocks make parallel calls. A missing or cut-off `</tool_call>` is
tolerated.
"""

from __future__ import annotations

from localradix.parsers.tool_stream import Region, ToolCallStreamParser

END = "</tool_call>"


class HermesToolParser(ToolCallStreamParser):
    name = "hermes"
    markers = ("<tool_call>",)

    def _region_step(self, region: Region, final: bool) -> bool:
        if region.state != "after":
            if region.obj is None and not self._skip_ws(region):
                return False
            return self._object_step(region)
        if not self._skip_ws(region):
            return False
        if self._buf.startswith(END):
            self._take(region, len(END))
        elif END.startswith(self._buf):  # the closing tag, or its start cut off by the end
            if not final:
                return False
            self._take(region, len(self._buf))
        return self._close(region, ok=True)
