"""Outputs as Ollama's bodies: one JSON object, or NDJSON lines while streaming."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from typing import Any

from localradix.parsers.events import ToolCall
from localradix.server.core.gather import Gathered, Timing
from localradix.server.core.http import encode_json
from localradix.server.core.output import call_arguments, output_spec
from localradix.server.core.parsed import ParsedStream, split
from localradix.server.errors import APIError
from localradix.server.tokenizer_manager import Job

# The engine's finish reason as Ollama's done_reason (anything else: "stop").
DONE_REASONS = {"length": "length"}


def now_iso(at: float | None = None) -> str:
    when = datetime.fromtimestamp(time.time() if at is None else at, timezone.utc)
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def _final(
    job: Job, model: str, timing: Timing, finish: str | None, context: bool
) -> dict[str, Any]:
    """The `done: true` fields: reason, `context` (if asked), counts and durations (ns).
    prompt_eval_count, as Ollama's, counts the prompt tokens evaluated: not those the cache
    served."""
    usage = job.usage()
    end = timing.end or time.monotonic()
    first = timing.first or end
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {
        "model": model,
        "created_at": now_iso(),
        "done": True,
        "done_reason": DONE_REASONS.get(finish or "", "stop"),
        **({"context": token_context(job)} if context else {}),
        "total_duration": _ns(end - timing.start),
        "load_duration": 0,
        "prompt_eval_count": usage["prompt_tokens"] - cached,
        "prompt_eval_duration": _ns(first - timing.start),
        "eval_count": usage["completion_tokens"],
        "eval_duration": _ns(end - first),
    }


def token_context(job: Job) -> list[int]:
    """Generate's `context`: the prompt's ids and the output's (the radix cache holds them, so a
    request that sends them back continues from the cache)."""
    return [*job.prompts[0], *job.choices[0].token_ids]


def _tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "function": {"index": i, "name": c.name, "arguments": call_arguments(c)}}
        for i, c in enumerate(calls)
    ]


Wrap = Callable[[str, str | None, list[ToolCall]], dict[str, Any]]


def chat_fields(content: str, thinking: str | None, calls: list[ToolCall]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = _tool_calls(calls)
    return {"message": message}


def generate_fields(content: str, thinking: str | None, calls: list[ToolCall]) -> dict[str, Any]:
    return {"response": content, **({"thinking": thinking} if thinking else {})}


def response_body(
    job: Job, model: str, gathered: Gathered, *, wrap: Wrap, think: Any, context: bool = False
) -> dict[str, Any]:
    parsed = output_spec(job).parse(gathered.text[0])
    thinking = parsed.reasoning if think is not False else None
    final = _final(job, model, gathered.timing, gathered.finish[0], context)
    return {**final, **wrap(parsed.content, thinking, parsed.calls)}


def _line(payload: dict[str, Any]) -> bytes:
    return encode_json(payload) + b"\n"


async def ndjson(
    job: Job, model: str, wrap: Wrap, think: Any, context: bool = False
) -> AsyncIterator[bytes]:
    """NDJSON lines: text as it comes, tool calls whole once parsed, then the `done` line
    (with generate's `context` if asked)."""
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
    timing = Timing(job)
    stream = ParsedStream(job, timing)
    try:
        async for part in stream.deltas():
            if isinstance(part, APIError):
                yield _line({"error": part.message})
                return
            for d in part:
                parsed = split(d.events)
                for event in parsed.calls:
                    call = calls.setdefault(event.index, [event.id or "", event.name or "", ""])
                    call[2] += event.arguments
                content = parsed.content or ""
                thinking = parsed.reasoning or "" if think is not False else ""
                if content or thinking:
                    yield _line({**_head(model), **wrap(content, thinking or None, [])})
        if calls:
            whole = [ToolCall(*calls[i]) for i in sorted(calls)]
            yield _line({**_head(model), **wrap("", None, whole)})
        final = _final(job, model, timing, stream.finish, context)
        yield _line({**final, **wrap("", None, [])})
    finally:
        job.close()


def _head(model: str) -> dict[str, Any]:
    return {"model": model, "created_at": now_iso(), "done": False}
