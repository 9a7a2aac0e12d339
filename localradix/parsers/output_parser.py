"""One response's output through both parsers: reasoning first, then tool calls in the answer.

The server needs only this: a `ChatOutputParser` per choice, `feed` each detokenized delta,
`finish` at the end; or `parse_chat_output` for a whole (non-streamed) output. Either parser may
be absent (None), in which case its part of the output is plain content.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from localradix.parsers.events import (
    ChatDelta,
    ContentDelta,
    IdFactory,
    ParsedChatOutput,
    ReasoningContentDelta,
    StreamEvent,
    coalesce,
)
from localradix.parsers.reasoning import (
    SPECIAL_MARKERS,
    ReasoningStreamParser,
    get_reasoning_parser,
)
from localradix.parsers.tool_calls import TOOL_PARSERS, get_tool_parser
from localradix.parsers.tool_stream import ToolCallStreamParser

__all__ = ["ChatDelta", "ChatOutputParser", "ParsedChatOutput", "ReasoningContentDelta"]

HARMONY = "harmony"  # gpt-oss: reasoning, calls and answer are one format, read by one parser


def _is_harmony(tool_parser: str | None, reasoning_parser: str | None) -> bool:
    return reasoning_parser == HARMONY or (
        tool_parser is not None and TOOL_PARSERS.canonical(tool_parser) == HARMONY
    )


def special_markers(tool_parser: str | None, reasoning_parser: str | None) -> tuple[str, ...]:
    """The marker texts these parsers read that are special tokens in their models: the
    detokenizer must keep them (see SamplingParams.kept_special_ids)."""
    markers: list[str] = []
    if tool_parser is not None:
        markers += get_tool_parser(tool_parser).special_markers
    if _is_harmony(tool_parser, reasoning_parser):
        markers += get_tool_parser(HARMONY).special_markers
    if reasoning_parser is not None:
        markers += SPECIAL_MARKERS.get(reasoning_parser, ())
    return tuple(dict.fromkeys(markers))


class ChatOutputParser:
    """Streaming: `feed(delta) -> list[ChatDelta]`, then `finish()`.

    Deltas come out in output order; neighbours of one kind are merged. `complete_calls`: see
    `ToolCallStreamParser` (each call sent whole once complete, incomplete ones dropped).
    `starts_in_reasoning`
    None takes the reasoning dialect's default (better: pass
    `get_reasoning_parser(name).prompt_opens_reasoning(prompt_text)`).
    """

    def __init__(
        self,
        *,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        starts_in_reasoning: bool | None = None,
        tool_names: Collection[str] | None = None,
        id_factory: IdFactory | None = None,
        complete_calls: bool = False,
        tool_schemas: Mapping[str, Any] | None = None,
    ) -> None:
        self._reasoning: ReasoningStreamParser | None = None
        self._tools: ToolCallStreamParser | None = None
        self._harmony: Any = None
        if _is_harmony(tool_parser, reasoning_parser):
            from localradix.parsers.harmony import HarmonyStreamParser

            self._harmony = HarmonyStreamParser(
                tool_names if tool_parser else (),
                id_factory,
                complete_calls=complete_calls,
            )
            return
        if reasoning_parser is not None:
            self._reasoning = get_reasoning_parser(reasoning_parser).parser(starts_in_reasoning)
        if tool_parser is not None:
            cls = get_tool_parser(tool_parser)
            self._tools = cls(
                tool_names, id_factory, complete_calls=complete_calls, tool_schemas=tool_schemas
            )

    def feed(self, text: str) -> list[ChatDelta]:
        if self._harmony is not None:
            return list(self._harmony.feed(text))
        if self._reasoning is None:
            return self._answer(text, final=False)
        reasoning, content = self._reasoning.feed(text)
        return self._merge(reasoning, self._answer(content, final=False))

    def finish(self) -> list[ChatDelta]:
        if self._harmony is not None:
            return list(self._harmony.finish())
        if self._reasoning is None:
            return self._answer("", final=True)
        reasoning, content = self._reasoning.finish()
        return self._merge(reasoning, self._answer(content, final=True))

    def _answer(self, text: str, final: bool) -> list[ChatDelta]:
        if self._tools is None:
            return [ContentDelta(text)] if text else []
        events: list[StreamEvent] = self._tools.feed(text) if text else []
        if final:
            events = coalesce(events + self._tools.finish())
        return list(events)

    @staticmethod
    def _merge(reasoning: str, rest: list[ChatDelta]) -> list[ChatDelta]:
        return [ReasoningContentDelta(reasoning), *rest] if reasoning else rest


def parse_chat_output(
    text: str,
    *,
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
    starts_in_reasoning: bool | None = None,
    tool_names: Collection[str] | None = None,
    id_factory: IdFactory | None = None,
    complete_calls: bool = False,
    tool_schemas: Mapping[str, Any] | None = None,
) -> ParsedChatOutput:
    """The non-streamed counterpart of `ChatOutputParser`. Never raises on model output."""
    if _is_harmony(tool_parser, reasoning_parser):
        from localradix.parsers.harmony import parse_harmony

        names = tool_names if tool_parser else ()
        return parse_harmony(text, names, id_factory, complete_calls=complete_calls)
    reasoning, content = None, text
    if reasoning_parser is not None:
        reasoning, content = get_reasoning_parser(reasoning_parser).split(text, starts_in_reasoning)
    if tool_parser is None:
        return ParsedChatOutput(reasoning, content)
    parsed = get_tool_parser(tool_parser).parse(
        content, tool_names, id_factory, complete_calls=complete_calls, tool_schemas=tool_schemas
    )
    return ParsedChatOutput(reasoning, parsed.content, parsed.calls)
