"""The streaming machine every tool-call dialect shares: content, held text, call regions.

Text is content until a dialect's marker (e.g. `<tool_call>`) or, for some dialects, a trigger
at the very start of the output opens a *region* holding one or more calls. Anything that might
be the start of a marker is held back until the next text decides. Inside a region the dialect
reads the calls; a call is *committed* (its header delta is sent) once its name is known, and
its arguments then stream as they arrive, validated character by character.

- A call that turns out malformed before it is committed goes back to content, so the stream
  never sends a call it has to take back. If it was the region's first call, the marker itself
  becomes content and the text after it is read again as content.
- Whitespace between content and a call, and between calls, is dropped (a "gap").
- Invariant: the output depends only on the concatenated input, not on how it is split.

`parse(text)` runs the same machine over the whole text and then puts back, as content, every
region whose calls did not all complete (a committed call cut off by the end of the output or
by invalid JSON): what the stream already sent as that call is the one place the two differ.

With `complete_calls` (what the server uses) the stream holds each call back until its
arguments are complete and then sends it as one delta, and a call that never completes (cut off
by the end of the output, e.g. by max_tokens, or broken by invalid JSON) is dropped: it is
neither a call nor content, in the stream and in `parse()` alike, so the two always agree.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from localradix.held_text import held_suffix_len
from localradix.parsers.call_object import CallObject
from localradix.parsers.call_record import Args, CallEnd, CallStart, Close, Item, Text, assemble
from localradix.parsers.events import (
    ContentDelta,
    IdFactory,
    ParsedToolCalls,
    StreamEvent,
    ToolCallDelta,
    coalesce,
    new_call_id,
)
from localradix.parsers.json_scan import WHITESPACE


@dataclass
class Region:
    """An open tool-call region; dialects keep their own state in `state` and `obj`."""

    marker: str
    raw: str = ""  # text consumed since the marker's start, marker included
    state: str = "start"
    calls: int = 0  # calls committed in this region
    open_call: int | None = None  # index of a committed call whose arguments are incomplete
    call_start: int = 0  # offset in `raw` where the current call's text begins
    obj: CallObject | None = None
    extra: dict[str, object] = field(default_factory=dict)


class ToolCallStreamParser:
    """Feed text deltas, get content and tool-call deltas; subclasses are the dialects.

    `tool_names`, when given, are the only names accepted as calls (others stay content).
    `complete_calls`: send only complete calls, each in one delta; drop the others (see above).
    `tool_schemas`: each function's `parameters` JSON schema, for dialects whose arguments are
    untyped text (XML parameters) and are typed by the schema.
    """

    name = ""
    markers: tuple[str, ...] = ()  # open a region anywhere in the content
    # Marker texts that are special tokens in the models of this dialect: the detokenizer keeps
    # them in the text (with skip_special_tokens) so that the parser can see them.
    special_markers: tuple[str, ...] = ()
    default_id_factory: IdFactory = staticmethod(new_call_id)

    def __init__(
        self,
        tool_names: Collection[str] | None = None,
        id_factory: IdFactory | None = None,
        *,
        complete_calls: bool = False,
        tool_schemas: Mapping[str, Any] | None = None,
    ) -> None:
        self._tool_names = frozenset(tool_names) if tool_names is not None else None
        self._tool_schemas: Mapping[str, Any] = tool_schemas or {}
        self._new_id = id_factory or type(self).default_id_factory
        self._complete_calls = complete_calls
        self._held: list[StreamEvent] = []  # with complete_calls: the open call's deltas
        self._buf = ""
        self._items: list[Item] = []
        self._ws = ""  # whitespace held until what follows decides content or gap
        self._ws_gap = False  # the held whitespace follows a call
        self._at_start = True  # no content but whitespace yet
        self._region: Region | None = None
        self._next_index = 0
        self._finished = False

    # ---- public --------------------------------------------------------------------------

    def feed(self, text: str) -> list[StreamEvent]:
        """Consume a text delta; returns the events it decides (possibly none)."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        self._run(final=False)
        return self._drain()

    def finish(self) -> list[StreamEvent]:
        """End of output: flush held text; an unfinished call stays as sent (or, with
        `complete_calls`, is dropped)."""
        if not self._finished:
            self._finished = True
            self._run(final=True)
            self._resolve_ws(gap=self._ws_gap)
        return self._drain()

    @classmethod
    def parse(
        cls,
        text: str,
        tool_names: Collection[str] | None = None,
        id_factory: IdFactory | None = None,
        *,
        complete_calls: bool = False,
        tool_schemas: Mapping[str, Any] | None = None,
    ) -> ParsedToolCalls:
        """A whole output: its content and its well-formed calls. Never raises."""
        parser = cls(
            tool_names, id_factory, complete_calls=complete_calls, tool_schemas=tool_schemas
        )
        parser._buf = text
        parser._finished = True
        parser._run(final=True)
        parser._resolve_ws(gap=parser._ws_gap)
        return assemble(parser._items, complete_calls)

    # ---- dialect hooks -------------------------------------------------------------------

    def _start_trigger(self, text: str, final: bool) -> bool | None:
        """At the start of the output (`text` has no leading whitespace): True when a region
        opens here without a marker, False when not, None when more text is needed."""
        return False

    def _region_step(self, region: Region, final: bool) -> bool:
        """Advance the open region; False when it needs more text."""
        raise NotImplementedError

    # ---- the loop ------------------------------------------------------------------------

    def _run(self, final: bool) -> None:
        while True:
            region = self._region
            if region is not None:
                progressed = self._region_step(region, final)
                if not progressed and final and self._region is region:
                    self._end_region(region)
                    progressed = True
            else:
                progressed = self._content_step(final)
            if not progressed:
                return

    def _content_step(self, final: bool) -> bool:
        buf = self._buf
        if not buf:
            return False
        if self._at_start:
            stripped = buf.lstrip(WHITESPACE)
            if not stripped:
                self._emit_content(buf)
                self._buf = ""
                return True
            opens = self._start_trigger(stripped, final)
            if opens is None and not final:
                return False
            self._at_start = False
            if opens:
                self._emit_content(buf[: len(buf) - len(stripped)])
                self._buf = stripped
                self._region = Region(marker="")
                return True
        index, marker = _find_marker(buf, self.markers)
        if marker:
            self._emit_content(buf[:index])
            self._buf = buf[index + len(marker) :]
            self._region = Region(marker=marker, raw=marker, call_start=len(marker))
            return True
        keep = held_suffix_len(buf, self.markers)
        if final:  # with complete_calls, a marker cut off by the end of the output is dropped
            self._emit_content(buf[: len(buf) - keep] if self._complete_calls else buf)
            self._buf = ""
            return True
        if keep == len(buf):
            return False
        self._emit_content(buf[: len(buf) - keep])
        self._buf = buf[len(buf) - keep :]
        return True

    def _drain(self) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        held = self._held if self._complete_calls else events
        for item in self._items:
            if isinstance(item, Text):
                if not item.gap:
                    events.append(ContentDelta(item.text))
            elif isinstance(item, CallStart):
                held.append(ToolCallDelta(item.index, item.id, item.name, ""))
            elif isinstance(item, Args):
                held.append(ToolCallDelta(item.index, arguments=item.text))
            elif not self._complete_calls:
                continue
            elif isinstance(item, CallEnd):
                events.extend(coalesce(held))  # the call is complete: send it whole
                held.clear()
            elif not item.ok:
                held.clear()  # the region's open call never completed: drop it
        self._items.clear()
        return coalesce(events)

    # ---- content and whitespace ----------------------------------------------------------

    def _emit_content(self, text: str) -> None:
        """Send `text` as content, holding its trailing whitespace back."""
        full = self._ws + text
        body = full.strip(WHITESPACE)
        if not body:
            self._ws = full
            return
        lead = len(full) - len(full.lstrip(WHITESPACE))
        end = lead + len(body)
        if lead:
            self._items.append(Text(full[:lead], gap=self._ws_gap))
        self._items.append(Text(body, gap=False))
        self._ws, self._ws_gap = full[end:], False
        self._at_start = False

    def _resolve_ws(self, gap: bool) -> None:
        if self._ws:
            self._items.append(Text(self._ws, gap=gap))
        self._ws, self._ws_gap = "", False

    # ---- helpers for dialects ------------------------------------------------------------

    def _take(self, region: Region, n: int) -> str:
        taken, self._buf = self._buf[:n], self._buf[n:]
        region.raw += taken
        return taken

    def _skip_ws(self, region: Region) -> bool:
        """Consume leading whitespace; True when a non-whitespace character follows."""
        rest = self._buf.lstrip(WHITESPACE)
        self._take(region, len(self._buf) - len(rest))
        return bool(rest)

    def _begin_call(self, region: Region) -> None:
        region.call_start = len(region.raw)
        region.obj = None

    def _commit(self, region: Region, name: str) -> int | None:
        """Send the header of a call named `name`; None when the name is not allowed."""
        if not name or (self._tool_names is not None and name not in self._tool_names):
            return None
        if region.calls == 0:
            self._resolve_ws(gap=True)
        index, self._next_index = self._next_index, self._next_index + 1
        region.calls += 1
        region.open_call = index
        self._items.append(CallStart(index, self._new_id(), name))
        return index

    def _send_args(self, index: int, text: str) -> None:
        if text:
            self._items.append(Args(index, text))

    def _call_done(self, region: Region) -> None:
        if region.open_call is not None:
            self._items.append(CallEnd(region.open_call))
        region.open_call = None
        region.obj = None

    def _reject_call(self, region: Region) -> bool:
        """The current call is not one (and was not committed): it goes back to content."""
        if region.calls == 0:
            self._buf = region.raw[len(region.marker) :] + self._buf
            self._region = None
            self._emit_content(region.marker)
            return True
        self._buf = region.raw[region.call_start :] + self._buf
        region.raw = region.raw[: region.call_start]
        self._close(region, ok=True)
        return True

    def _close(self, region: Region, ok: bool) -> bool:
        self._items.append(Close(ok, region.raw))
        self._region = None
        self._ws_gap = True
        self._at_start = False
        return True

    def _end_region(self, region: Region) -> None:
        """End of output inside a region."""
        if region.open_call is not None:
            self._close(region, ok=False)
        elif self._complete_calls and (region.state == "call" or region.calls == 0):
            self._close(region, ok=False)  # a call cut off before its name: dropped too
        elif region.state == "call" or region.calls == 0:  # a call was being read
            self._reject_call(region)
        else:
            self._close(region, ok=True)

    # ---- the JSON call object shared by the JSON dialects --------------------------------

    def _object_step(self, region: Region) -> bool:
        """Read `{"name": ..., "arguments": ...}`; on completion region.obj is None and
        region.state is "after". Returns progress."""
        obj = region.obj
        if obj is None:
            if not self._buf:
                return False
            if self._buf[0] != "{":
                return self._reject_call(region)
            obj = region.obj = CallObject()
            region.state = "call"
        consumed = obj.feed(self._buf)
        self._take(region, consumed)
        # Commit before looking at an error: a stream fed character by character would have
        # committed as soon as the header was ready, before reaching the bad character.
        if region.open_call is None:
            header = obj.header()
            if header is False:
                return self._reject_call(region)
            if isinstance(header, str) and self._commit(region, header) is None:
                return self._reject_call(region)
        if obj.scanner.error:
            return self._object_failed(region, obj)
        if region.open_call is not None:
            self._send_args(region.open_call, obj.take_args())
            if obj.scanner.done:
                self._call_done(region)
                region.state = "after"
        return consumed > 0 or region.state == "after"

    def _object_failed(self, region: Region, obj: CallObject) -> bool:
        if region.open_call is None:
            return self._reject_call(region)
        self._send_args(region.open_call, obj.take_args())
        if obj.args_complete():
            self._call_done(region)
            return self._close(region, ok=True)
        return self._close(region, ok=False)


def _find_marker(buf: str, markers: tuple[str, ...]) -> tuple[int, str]:
    best, found = len(buf), ""
    for marker in markers:
        index = buf.find(marker)
        if index != -1 and (index < best or (index == best and len(marker) > len(found))):
            best, found = index, marker
    return best, found
