"""Outputs as the Responses API's response object: output items (reasoning, message,
function_call), status, usage with the radix cache's cached_tokens; and the conversation
message a response adds for `previous_response_id`."""

from __future__ import annotations

import time
from typing import Any

from localradix.parsers.output_parser import ParsedChatOutput
from localradix.server.responses.protocol import ResponsesRequest
from localradix.server.tokenizer_manager import Job

INCOMPLETE = {"length": "max_output_tokens"}  # finish reasons that leave a response incomplete


def echo(req: ResponsesRequest, model: str) -> dict[str, Any]:
    """The request's fields a response object repeats."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    text_format = {k: v for k, v in vars_of(fmt).items() if v is not None} if fmt else None
    return {
        "model": model,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id,
        "parallel_tool_calls": req.parallel_tool_calls,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "tool_choice": _tool_choice(req),
        "tools": [vars_of(t) for t in req.tools or ()],
        "text": {"format": text_format or {"type": "text"}},
        "reasoning": {"effort": None, "summary": None},
        "truncation": "disabled",
        "store": req.store,
        "metadata": req.metadata or {},
        "user": req.user,
    }


def vars_of(struct: Any) -> dict[str, Any]:
    return {f: getattr(struct, f) for f in struct.__struct_fields__}


def _tool_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return choice or "auto"
    return {"type": choice.type, "name": choice.name}


def envelope(job: Job, fields: dict[str, Any]) -> dict[str, Any]:
    """The response object while it runs: no output yet."""
    return {
        "id": f"resp_{job.rid}",
        "object": "response",
        "created_at": job.created,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        **fields,
        "output": [],
        "usage": None,
    }


def status(finish: str | None) -> str:
    return "incomplete" if finish in INCOMPLETE else "completed"


def reasoning_item(job: Job, text: str, state: str) -> dict[str, Any]:
    content = [reasoning_part(text)] if text else []
    return {
        "type": "reasoning",
        "id": f"rs_{job.rid}",
        "summary": [],
        "content": content,
        "status": state,
    }


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(job: Job, text: str | None, state: str) -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {
        "type": "message",
        "id": f"msg_{job.rid}",
        "status": state,
        "role": "assistant",
        "content": content,
    }


def call_item(call_id: str, name: str, arguments: str, state: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": state,
    }


def output_items(job: Job, parsed: ParsedChatOutput, finish: str | None) -> list[dict[str, Any]]:
    """The output items; only the last one can have been cut short (status incomplete)."""
    items = []
    if parsed.reasoning:
        items.append(reasoning_item(job, parsed.reasoning, "completed"))
    if parsed.content or not parsed.calls:
        items.append(message_item(job, parsed.content or "", "completed"))
    items.extend(call_item(c.id, c.name, c.arguments or "{}", "completed") for c in parsed.calls)
    items[-1]["status"] = status(finish)
    return items


def finished(
    job: Job, fields: dict[str, Any], items: list[dict[str, Any]], finish: str | None
) -> dict[str, Any]:
    """The response object once the job ended."""
    body = envelope(job, fields)
    body["status"] = status(finish)
    if finish in INCOMPLETE:
        body["incomplete_details"] = {"reason": INCOMPLETE[finish]}
    body["output"] = items
    body["completed_at"] = int(time.time())
    body["usage"] = usage(job, items)
    return body


def usage(job: Job, items: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI counts cached input inside input_tokens; reasoning inside output_tokens."""
    counts = job.usage()
    thought = "".join(p["text"] for i in items if i["type"] == "reasoning" for p in i["content"])
    reasoning = len(job.manager.tokenizer.encode(thought, False)) if thought else 0
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": counts["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": min(reasoning, counts["completion_tokens"])},
        "total_tokens": counts["prompt_tokens"] + counts["completion_tokens"],
    }


def assistant_turn(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A response's output as the chat message the next turn's prompt renders."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in items:
        if item["type"] == "reasoning":
            message["reasoning_content"] = "".join(p["text"] for p in item["content"])
        elif item["type"] == "message":
            message["content"] = "".join(p["text"] for p in item["content"])
        elif item["type"] == "function_call":
            call = {"name": item["name"], "arguments": item["arguments"]}
            message.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": call}
            )
    return message
