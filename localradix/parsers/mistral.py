"""Mistral dialect: `[TOOL_CALLS]` then the calls, in either of Mistral's two layouts.

- JSON list (tokenizer v3, e.g. Mistral-7B-Instruct-v0.3, Nemo, Small 2501):
  `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` (a single object is accepted too).
- Name and arguments (tokenizer v11+, e.g. Mistral Small 3.2, Magistral, Devstral):
  `[TOOL_CALLS]f[ARGS]{...}`, optionally `[TOOL_CALLS]f[CALL_ID]abc123xyz[ARGS]{...}`; one
  marker per call.

`[TOOL_CALLS]` is a control token: the detokenizer must keep special tokens for it to be seen.
Call ids are nine alphanumerics, the only ids Mistral's chat templates accept back.
"""

from __future__ import annotations

import re

from localradix.parsers.events import new_mistral_call_id
from localradix.parsers.json_scan import JsonScanner
from localradix.parsers.tool_stream import Region, ToolCallStreamParser

ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")
_ID = re.compile(r"[A-Za-z0-9]*")


class MistralToolParser(ToolCallStreamParser):
    name = "mistral"
    markers = ("[TOOL_CALLS]",)
    default_id_factory = staticmethod(new_mistral_call_id)

    def _region_step(self, region: Region, final: bool) -> bool:
        step = getattr(self, "_step_" + region.state)
        return bool(step(region, final))

    def _step_start(self, region: Region, final: bool) -> bool:
        if not self._skip_ws(region):
            return False
        first = self._buf[0]
        if first == "[":
            self._take(region, 1)
            region.state = "item"
        else:
            region.state = "call" if first == "{" else "name"
        return True

    # -- JSON layout ------------------------------------------------------------------------

    def _step_item(self, region: Region, final: bool) -> bool:
        if not self._skip_ws(region):
            return False
        self._begin_call(region)
        region.state = "call"
        return True

    def _step_call(self, region: Region, final: bool) -> bool:
        return self._object_step(region)

    def _step_after(self, region: Region, final: bool) -> bool:
        if not self._skip_ws(region):
            return False
        separator = self._buf[0]
        if separator in ",]":
            self._take(region, 1)
        if separator == ",":
            region.state = "item"
            return True
        return self._close(region, ok=True)

    # -- name[ARGS]{...} layout ---------------------------------------------------------------

    def _step_name(self, region: Region, final: bool) -> bool:
        name_len = _match_len(_NAME, self._buf)
        found = _tag_after(self._buf, name_len, (ARGS, CALL_ID), final)
        if found is None:
            return False
        if not found or name_len == 0:
            return self._reject_call(region)
        region.extra["name"] = self._take(region, name_len)
        self._take(region, len(found))
        region.state = "args_begin" if found == ARGS else "call_id"
        return True

    def _step_call_id(self, region: Region, final: bool) -> bool:
        id_len = _match_len(_ID, self._buf)
        found = _tag_after(self._buf, id_len, (ARGS,), final)
        if found is None:
            return False
        if not found:
            return self._reject_call(region)
        self._take(region, id_len + len(found))
        region.state = "args_begin"
        return True

    def _step_args_begin(self, region: Region, final: bool) -> bool:
        if not self._skip_ws(region):
            return False
        scanner = JsonScanner()
        consumed = scanner.feed(self._buf)
        if consumed == 0:  # not even the first character of a JSON value
            return self._reject_call(region)
        if self._commit(region, str(region.extra["name"])) is None:
            return self._reject_call(region)
        region.extra["scanner"] = scanner
        self._send_args_taken(region, scanner, consumed)
        return True

    def _step_args(self, region: Region, final: bool) -> bool:
        scanner = region.extra["scanner"]
        assert isinstance(scanner, JsonScanner)
        consumed = scanner.feed(self._buf)
        if consumed == 0 and not (scanner.done or scanner.error):
            return False
        self._send_args_taken(region, scanner, consumed)
        return True

    def _send_args_taken(self, region: Region, scanner: JsonScanner, consumed: int) -> None:
        assert region.open_call is not None
        self._send_args(region.open_call, self._take(region, consumed))
        if scanner.done:
            self._call_done(region)
            self._close(region, ok=True)
        elif scanner.error:
            self._close(region, ok=False)
        else:
            region.state = "args"


def _match_len(pattern: re.Pattern[str], text: str) -> int:
    match = pattern.match(text)
    return match.end() if match else 0


def _tag_after(text: str, start: int, tags: tuple[str, ...], final: bool) -> str | None:
    """The tag at `text[start:]`; "" when none can be there; None when more text is needed."""
    rest = text[start:]
    for tag in tags:
        if rest.startswith(tag):
            return tag
    if not final and (not rest or any(tag.startswith(rest) for tag in tags)):
        return None
    return ""
