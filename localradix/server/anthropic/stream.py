"""A message as Anthropic's typed SSE events: message_start, content blocks (start, ping,
deltas, stop), message_delta (stop reason, usage), message_stop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from localradix.messages import CachePin
from localradix.server.anthropic.render import envelope, error_body, stop, usage
from localradix.server.core.http import encode_json
from localradix.server.core.parsed import ParsedStream, Split, runs
from localradix.server.errors import APIError
from localradix.server.tokenizer_manager import Job


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return (
        b"event: " + kind.encode() + b"\ndata: " + encode_json({"type": kind, **payload}) + b"\n\n"
    )


class _Blocks:
    """The stream's content blocks: opens and closes them as the output changes kind."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None  # "text" | "thinking" | "tool_use"
        self.call: int | None = None  # the parser's index of the open tool call
        self.called = False
        self.pinged = False

    def open(self, kind: str, block: dict[str, Any], call: int | None = None) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.kind, self.call = kind, call
        out.append(_event("content_block_start", {"index": self.index, "content_block": block}))
        if not self.pinged:  # Anthropic pings once after the first block opens
            self.pinged = True
            out.append(_event("ping", {}))
        return out

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [_event("content_block_stop", {"index": self.index})]

    def delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self.index, "delta": delta})

    def feed(self, parsed: Split) -> list[bytes]:
        """Reasoning, content, then tool calls (`runs` keeps the output's order)."""
        out: list[bytes] = []
        if parsed.reasoning:
            if self.kind != "thinking":
                out += self.open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self.delta({"type": "thinking_delta", "thinking": parsed.reasoning}))
        if parsed.content:
            if self.kind != "text":
                out += self.open("text", {"type": "text", "text": ""})
            out.append(self.delta({"type": "text_delta", "text": parsed.content}))
        for call in parsed.calls:
            if call.id is not None or self.kind != "tool_use" or self.call != call.index:
                self.called = True
                block: dict[str, Any] = {"type": "tool_use", "id": call.id, "name": call.name}
                block["input"] = {}
                out += self.open("tool_use", block, call.index)
            if call.arguments:
                out.append(self.delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return out


async def message_events(
    job: Job, model: str, pins: tuple[CachePin, ...] = ()
) -> AsyncIterator[bytes]:
    """message_start, content blocks (start, ping, deltas, stop), message_delta, message_stop."""
    blocks = _Blocks()
    stream = ParsedStream(job)
    start = envelope(job, model)
    start["usage"] = {"input_tokens": job.usage()["prompt_tokens"], "output_tokens": 0}
    try:
        yield _event("message_start", {"message": start})
        async for part in stream.deltas():
            if isinstance(part, APIError):
                yield _event("error", {"error": error_body(part)["error"]})
                return
            for parsed in (run for d in part for run in runs(d.events)):
                for chunk in blocks.feed(parsed):
                    yield chunk
        if blocks.index < 0:  # an empty answer still has one (empty) text block
            for chunk in blocks.open("text", {"type": "text", "text": ""}):
                yield chunk
        for chunk in blocks.close():
            yield chunk
        reason, sequence = stop(job, stream.finish, blocks.called)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        yield _event("message_delta", {"delta": delta, "usage": usage(job, pins)})
        yield _event("message_stop", {})
    finally:
        job.close()
