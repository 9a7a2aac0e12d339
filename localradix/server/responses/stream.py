"""A response as the Responses API's typed SSE events, in the order the openai SDK's stream
helper accumulates them: response.created, response.in_progress, then per output item
output_item.added, (content_part.added, text deltas, text done, content_part.done | arguments
delta and done), output_item.done, and finally response.completed (or response.incomplete).
Every event carries its `sequence_number`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from localradix.server.core.http import encode_json
from localradix.server.core.parsed import ParsedStream, Split, runs
from localradix.server.errors import APIError
from localradix.server.responses import render
from localradix.server.tokenizer_manager import Job

# The text part of each item kind: (its part, its delta event, its done event); calls have none.
TEXTS = {
    "message": (render.text_part, "response.output_text.delta", "response.output_text.done"),
    "reasoning": (
        render.reasoning_part,
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
    ),
}


class _Events:
    """Numbers the events (sequence_number) and writes them as SSE."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, payload: dict[str, Any]) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + encode_json(event) + b"\n\n"


class _Items:
    """The response's output items: opens and closes them as the output changes kind, and
    keeps each finished item for the final response object."""

    def __init__(self, job: Job, event: _Events) -> None:
        self.job = job
        self.event = event
        self.done: list[dict[str, Any]] = []
        self.item: dict[str, Any] | None = None  # the open item
        self.text = ""  # its text or arguments so far

    def _where(self) -> dict[str, Any]:
        assert self.item is not None
        return {"item_id": self.item["id"], "output_index": len(self.done)}

    def open(self, item: dict[str, Any]) -> list[bytes]:
        out = self.close("completed")
        self.item, self.text = item, ""
        out.append(
            self.event("response.output_item.added", {"output_index": len(self.done), "item": item})
        )
        if item["type"] in TEXTS:
            out.append(self._part("response.content_part.added", TEXTS[item["type"]][0]("")))
        return out

    def _part(self, kind: str, part: dict[str, Any]) -> bytes:
        return self.event(kind, {**self._where(), "content_index": 0, "part": part})

    def add(self, text: str) -> bytes:
        assert self.item is not None
        self.text += text
        if self.item["type"] == "function_call":
            return self.event(
                "response.function_call_arguments.delta", {**self._where(), "delta": text}
            )
        payload = {**self._where(), "content_index": 0, "delta": text}
        if self.item["type"] == "message":
            payload["logprobs"] = []
        return self.event(TEXTS[self.item["type"]][1], payload)

    def close(self, state: str) -> list[bytes]:
        item = self.item
        if item is None:
            return []
        if item["type"] == "function_call":
            done = {**item, "arguments": self.text or "{}", "status": state}
            payload = {**self._where(), "name": item["name"], "arguments": done["arguments"]}
            out = [self.event("response.function_call_arguments.done", payload)]
        else:
            done, out = self._close_text(item["type"], state)
        index = len(self.done)
        out.append(self.event("response.output_item.done", {"output_index": index, "item": done}))
        self.done.append(done)
        self.item = None
        return out

    def _close_text(self, kind: str, state: str) -> tuple[dict[str, Any], list[bytes]]:
        """A message's or reasoning item's text done, its part done, and the finished item."""
        if kind == "message":
            done = render.message_item(self.job, self.text, state)
            payload = {**self._where(), "content_index": 0, "text": self.text, "logprobs": []}
        else:
            done = render.reasoning_item(self.job, self.text, state)
            payload = {**self._where(), "content_index": 0, "text": self.text}
        part = done["content"][0] if done["content"] else TEXTS[kind][0]("")
        out = [self.event(TEXTS[kind][2], payload)]
        out.append(self._part("response.content_part.done", part))
        return done, out

    def feed(self, parsed: Split) -> list[bytes]:
        """Reasoning, content, then tool calls (`runs` keeps the output's order)."""
        out: list[bytes] = []
        if parsed.reasoning:
            if self._kind() != "reasoning":
                out += self.open(render.reasoning_item(self.job, "", "in_progress"))
            out.append(self.add(parsed.reasoning))
        if parsed.content:
            if self._kind() != "message":
                out += self.open(render.message_item(self.job, None, "in_progress"))
            out.append(self.add(parsed.content))
        for call in parsed.calls:
            if call.id is not None:
                out += self.open(render.call_item(call.id, call.name or "", "", "in_progress"))
            if call.arguments:
                out.append(self.add(call.arguments))
        return out

    def _kind(self) -> str | None:
        return self.item["type"] if self.item is not None else None


def _failed(event: _Events, start: dict[str, Any], err: APIError) -> list[bytes]:
    """An error after the headers went out: the error event, then response.failed."""
    failed = {
        **start,
        "status": "failed",
        "error": {"code": err.code or "server_error", "message": err.message},
    }
    return [
        event("error", {"code": err.code, "message": err.message, "param": err.param}),
        event("response.failed", {"response": failed}),
    ]


async def response_events(
    job: Job, fields: dict[str, Any], keep: Callable[[dict[str, Any]], None]
) -> AsyncIterator[bytes]:
    """The response's events; `keep` is given the final response object."""
    event = _Events()
    items = _Items(job, event)
    stream = ParsedStream(job)
    start = render.envelope(job, fields)
    try:
        yield event("response.created", {"response": start})
        yield event("response.in_progress", {"response": start})
        async for part in stream.deltas():
            if isinstance(part, APIError):
                for chunk in _failed(event, start, part):
                    yield chunk
                return
            for parsed in (run for d in part for run in runs(d.events)):
                for chunk in items.feed(parsed):
                    yield chunk
        if not items.done and items.item is None:  # an empty answer is still one message
            for chunk in items.open(render.message_item(job, None, "in_progress")):
                yield chunk
        for chunk in items.close(render.status(stream.finish)):
            yield chunk
        body = render.finished(job, fields, items.done, stream.finish)
        keep(body)
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        yield event(kind, {"response": body})
    finally:
        job.close()
