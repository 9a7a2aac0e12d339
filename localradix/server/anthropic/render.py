"""Outputs as Anthropic's message body (content blocks, stop reason, usage), the model list's
pages, and errors as `{"type": "error", "error": {"type", "message"}}`."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from localradix.messages import CachePin
from localradix.parsers.events import ToolCall
from localradix.server.anthropic.cache_control import creation_by_ttl, creation_tokens
from localradix.server.core.gather import matched_stop
from localradix.server.core.output import call_arguments, output_spec
from localradix.server.errors import APIError
from localradix.server.tokenizer_manager import Job

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
# Why the output ended (the engine's finish reason, or what the core saw in the output) as
# Anthropic's stop_reason; anything else ended the turn.
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop_sequence": "stop_sequence"}


def usage(job: Job, pins: tuple[CachePin, ...] = ()) -> dict[str, Any]:
    """Anthropic counts cached input apart: input_tokens + cache_read_input_tokens +
    cache_creation_input_tokens (what `pins` newly cached, also split by TTL) = prompt."""
    counts = job.usage()
    cached = counts["prompt_tokens_details"]["cached_tokens"]
    created = creation_tokens(pins, cached)
    return {
        "input_tokens": counts["prompt_tokens"] - cached - created,
        "output_tokens": counts["completion_tokens"],
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": cached,
        "cache_creation": creation_by_ttl(pins, cached),
    }


def stop(job: Job, finish: str | None, called: bool) -> tuple[str, str | None]:
    """stop_reason and stop_sequence."""
    sequence = matched_stop(job) if finish != "length" and not called else None
    why = finish
    if finish == "length" or called:
        why = "length" if finish == "length" else "tool_calls"
    elif sequence is not None:
        why = "stop_sequence"
    return STOP_REASONS.get(why or "", "end_turn"), sequence


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call_arguments(call)}


def envelope(job: Job, model: str) -> dict[str, Any]:
    return {
        "id": f"msg_{job.rid}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }


def message_body(
    job: Job, model: str, text: str, finish: str | None, pins: tuple[CachePin, ...] = ()
) -> dict[str, Any]:
    parsed = output_spec(job).parse(text)
    content: list[dict[str, Any]] = []
    if parsed.reasoning:
        content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    if parsed.content or not parsed.calls:
        content.append({"type": "text", "text": parsed.content})
    content.extend(_tool_use(call) for call in parsed.calls)
    reason, sequence = stop(job, finish, bool(parsed.calls))
    body = envelope(job, model)
    body.update(content=content, stop_reason=reason, stop_sequence=sequence, usage=usage(job, pins))
    return body


def error_body(err: APIError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(
        err.status, "api_error" if err.status >= 500 else "invalid_request_error"
    )
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def model_info(name: str, context_length: int, created: float) -> dict[str, Any]:
    """A model as Anthropic's ModelInfo (`created_at` in RFC 3339; 0: the context is unknown)."""
    return {
        "type": "model",
        "id": name,
        "display_name": name,
        "created_at": rfc3339(created),
        "lifecycle": "active",
        "max_input_tokens": context_length or None,
        "max_tokens": context_length or None,
    }


def rfc3339(at: float) -> str:
    return datetime.fromtimestamp(int(at), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def model_page(
    infos: list[dict[str, Any]], after_id: str | None, before_id: str | None, limit: int
) -> dict[str, Any]:
    """One page of Anthropic's model list: the `limit` models after `after_id`, or before
    `before_id`; `has_more` says whether more lie that way."""
    ids = [info["id"] for info in infos]
    if before_id is not None:
        end = _position(ids, before_id, "before_id")
        start = max(0, end - limit)
        more = start > 0
    else:
        start = 0 if after_id is None else _position(ids, after_id, "after_id") + 1
        end = start + limit
        more = end < len(ids)
    data = infos[start:end]
    return {
        "data": data,
        "has_more": more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def _position(ids: list[str], wanted: str, param: str) -> int:
    if wanted not in ids:
        raise APIError(400, f"{param}: '{wanted}' is not a listed model", param=param)
    return ids.index(wanted)
