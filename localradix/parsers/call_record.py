"""The tool-call machine's internal record, and how `parse()` assembles it into a result.

The record is richer than the stream: `parse()` needs each region's raw text back, to put a
region whose calls did not all complete back as content.
"""

from __future__ import annotations

from dataclasses import dataclass

from localradix.parsers.events import ParsedToolCalls, ToolCall


@dataclass
class Text:
    text: str
    gap: bool  # whitespace dropped next to a call


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class Args:
    index: int
    text: str


@dataclass
class CallEnd:
    index: int


@dataclass
class Close:
    ok: bool  # every committed call in the region completed
    raw: str  # the region's text, marker included


Item = Text | CallStart | Args | CallEnd | Close


def assemble(items: list[Item], complete_calls: bool = False) -> ParsedToolCalls:
    """Non-streaming result: failed regions back to raw text (with `complete_calls`: their
    complete calls kept, the rest dropped); gaps next to calls dropped."""
    segments: list[tuple[str, object]] = []
    pending: list[list[str]] = []  # [id, name, arguments] of the open region's calls
    complete = 0  # how many of them completed
    for item in items:
        if isinstance(item, Text):
            segments.append(("gap" if item.gap else "text", item.text))
        elif isinstance(item, CallStart):
            pending.append([item.id, item.name, ""])
        elif isinstance(item, Args):
            pending[-1][2] += item.text
        elif isinstance(item, CallEnd):
            complete += 1
        else:
            if item.ok or complete_calls:
                kept = pending if item.ok else pending[:complete]
                segments.append(("calls", [ToolCall(*call) for call in kept]))
            else:
                segments.append(("text", item.raw))
            pending, complete = [], 0
    content: list[str] = []
    calls: list[ToolCall] = []
    for i, (kind, value) in enumerate(segments):
        if kind == "calls":
            calls.extend(value)  # type: ignore[arg-type]
        elif kind == "text" or not _next_to_calls(segments, i):
            content.append(str(value))
    return ParsedToolCalls("".join(content), calls)


def _next_to_calls(segments: list[tuple[str, object]], i: int) -> bool:
    for step in (-1, 1):
        j = i + step
        while 0 <= j < len(segments) and segments[j][0] == "gap":
            j += step
        if 0 <= j < len(segments) and segments[j][0] == "calls":
            return True
    return False
