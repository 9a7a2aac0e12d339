"""What the tool-call parsers hand to the server: finished calls and streamed deltas.

Streamed deltas follow OpenAI's `choices[].delta.tool_calls[]` items: the first delta of a call
carries `index`, `id`, `type: "function"` and `function.name` (its `function.arguments` may be
""); later deltas carry only `index` and an `arguments` fragment. Concatenating a call's
fragments gives its arguments as JSON text.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    """An OpenAI-style call id: `call_` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


_ALNUM = string.ascii_letters + string.digits


def new_mistral_call_id() -> str:
    """Nine alphanumerics: Mistral's chat templates reject any other tool_call_id."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


IdFactory = Callable[[], str]


@dataclass(frozen=True)
class ToolCall:
    """One finished call; `arguments` is JSON text (usually an object)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The `choices[].message.tool_calls[]` item."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedToolCalls:
    """A whole output split into text for `message.content` and the calls (in order)."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class ContentDelta:
    """Text for `delta.content`."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One `delta.tool_calls[]` item: a call's header (id and name set) and/or an arguments
    fragment. `id` and `name` are set on exactly the first delta of each call."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


StreamEvent = ContentDelta | ToolCallDelta


def coalesce(events: list[StreamEvent]) -> list[StreamEvent]:
    """Merge neighbours of one kind: content with content, deltas of the same call index."""
    out: list[StreamEvent] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, ContentDelta) and isinstance(last, ContentDelta):
            out[-1] = ContentDelta(last.text + event.text)
        elif (
            isinstance(event, ToolCallDelta)
            and isinstance(last, ToolCallDelta)
            and last.index == event.index
            and event.id is None
        ):
            out[-1] = ToolCallDelta(
                last.index, last.id, last.name, last.arguments + event.arguments
            )
        else:
            out.append(event)
    return out


@dataclass(frozen=True)
class ReasoningContentDelta:
    """Text for `delta.reasoning_content`."""

    text: str


ChatDelta = ReasoningContentDelta | ContentDelta | ToolCallDelta


@dataclass(frozen=True)
class ParsedChatOutput:
    """A whole output: `reasoning` None when there was no reasoning block."""

    reasoning: str | None
    content: str
    calls: list[ToolCall] = field(default_factory=list)
