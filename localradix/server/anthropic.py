"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), which Claude-style
coding agents speak (`ANTHROPIC_BASE_URL`), over the OpenAI routes' request core (dialect.py).

Messages and blocks become OpenAI chat messages (tool_use -> tool_calls, tool_result -> tool
messages, thinking -> reasoning_content); the output comes back as content blocks, streamed as
Anthropic's typed SSE events. `usage.cache_read_input_tokens` is what the radix cache served.
Errors are `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from litestar import Request, Response, Router, post
from litestar.types import ControllerRouterHandler
from msgspec import Meta, Struct

from localradix.parsers.events import ContentDelta, ToolCall, ToolCallDelta
from localradix.parsers.output_parser import ReasoningContentDelta
from localradix.server import serving
from localradix.server.dialect import (
    ClosingStream,
    Timing,
    batches,
    chat_prompt_ids,
    check_model,
    constraint_compiled,
    convert,
    decode,
    encode_json,
    error_handler,
    gather,
    json_response,
    matched_stop,
    state,
)
from localradix.server.errors import APIError, bad_request
from localradix.server.protocol import ChatCompletionRequest
from localradix.server.tokenizer_manager import Job, TokenizerManager

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
RENAMES = {
    "max_tokens": "max_tokens",
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "messages": "messages",
}
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}

# ---- request bodies (unknown keys ignored, types strict) -------------------------------------


class Block(Struct, kw_only=True):
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[Block] | None = None
    is_error: bool = False
    thinking: str | None = None  # thinking
    signature: str | None = None
    cache_control: dict[str, Any] | None = None


class Message(Struct):
    role: str
    content: str | list[Block]


class Tool(Struct, kw_only=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent; server tools (web_search_...) are refused
    cache_control: dict[str, Any] | None = None


class ToolChoice(Struct, kw_only=True):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool = False


class OutputFormat(Struct, kw_only=True):
    type: str
    schema: dict[str, Any]


class OutputConfig(Struct, kw_only=True):
    format: OutputFormat | None = None  # structured output: the grammar path


class CountTokensRequest(Struct, kw_only=True):
    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1)]
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None


# ---- request -> OpenAI request ---------------------------------------------------------------


def _text(blocks: str | list[Block] | None, where: str) -> str:
    """Text blocks joined; anything else (images, documents) is refused, naming the place."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    texts = []
    for block in blocks:
        if block.type != "text" or block.text is None:
            raise bad_request(f"{where}: only text blocks are supported here, not '{block.type}'")
        texts.append(block.text)
    return "".join(texts)


def _user(msg: Message, i: int) -> list[dict[str, Any]]:
    """A user turn: its tool results (as tool messages, first) and its text."""
    if isinstance(msg.content, str):
        return [{"role": "user", "content": msg.content}]
    out, texts = [], []
    for j, block in enumerate(msg.content):
        where = f"messages[{i}].content[{j}]"
        if block.type == "tool_result":
            if not block.tool_use_id:
                raise bad_request(f"{where}: a tool_result needs 'tool_use_id'")
            content = _text(block.content, where)
            if block.is_error:
                content = f"Error: {content}"
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
        elif block.type == "text" and block.text is not None:
            texts.append(block.text)
        else:
            raise bad_request(f"{where}: '{block.type}' blocks are not supported in a user turn")
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant(msg: Message, i: int) -> dict[str, Any]:
    """An assistant turn: text, thinking (reasoning_content) and tool_use (tool_calls)."""
    if isinstance(msg.content, str):
        return {"role": "assistant", "content": msg.content}
    texts, thinking, calls = [], [], []
    for j, block in enumerate(msg.content):
        if block.type == "text" and block.text is not None:
            texts.append(block.text)
        elif block.type == "thinking":
            thinking.append(block.thinking or "")
        elif block.type == "redacted_thinking":
            continue
        elif block.type == "tool_use" and block.id and block.name:
            function = {"name": block.name, "arguments": block.input or {}}
            calls.append({"id": block.id, "type": "function", "function": function})
        else:
            where = f"messages[{i}].content[{j}]"
            raise bad_request(
                f"{where}: '{block.type}' blocks are not supported in an assistant turn"
            )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        out["reasoning_content"] = "".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


def _messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    out = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system, "system")})
    for i, msg in enumerate(req.messages):
        if msg.role == "user":
            out.extend(_user(msg, i))
        elif msg.role == "assistant":
            out.append(_assistant(msg, i))
        else:
            raise bad_request(f"messages[{i}].role must be 'user' or 'assistant', not '{msg.role}'")
    return out


def _tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise bad_request(f"tools[{i}]: server tool '{tool.type}' is not supported")
        schema = tool.input_schema or {"type": "object", "properties": {}}
        function = {"name": tool.name, "description": tool.description or "", "parameters": schema}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: ToolChoice | None) -> tuple[Any, bool]:
    """Anthropic's tool_choice as OpenAI's, and whether parallel calls are allowed."""
    if choice is None:
        return None, True
    parallel = not choice.disable_parallel_tool_use
    if choice.type in ("auto", "none"):
        return choice.type, parallel
    if choice.type == "any":
        return "required", parallel
    if choice.type == "tool" and choice.name:
        return {"type": "function", "function": {"name": choice.name}}, parallel
    raise bad_request(
        "tool_choice.type must be 'auto', 'any', 'none' or 'tool' (with 'name'), "
        f"not {choice.type!r}"
    )


def _output_format(config: OutputConfig | None) -> dict[str, Any] | None:
    if config is None or config.format is None:
        return None
    if config.format.type != "json_schema":
        raise bad_request(
            f"output_config.format.type must be 'json_schema', not {config.format.type!r}"
        )
    schema = {"name": "output", "schema": config.format.schema}
    return {"type": "json_schema", "json_schema": schema}


def chat_request(manager: TokenizerManager, req: CountTokensRequest) -> ChatCompletionRequest:
    model = check_model(manager, req.model)
    tools = _tools(req.tools)
    choice, parallel = _tool_choice(req.tool_choice)
    fields: dict[str, Any] = {
        "model": model,
        "messages": _messages(req),
        "tools": tools,
        "tool_choice": choice if tools else None,
        "parallel_tool_calls": parallel,
    }
    if isinstance(req, MessagesRequest):
        fields.update(
            max_tokens=req.max_tokens,
            stop=req.stop_sequences or None,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            response_format=_output_format(req.output_config),
        )
    return convert(
        {k: v for k, v in fields.items() if v is not None}, ChatCompletionRequest, RENAMES
    )


# ---- outputs -> Anthropic bodies -------------------------------------------------------------


def _usage(job: Job) -> dict[str, int]:
    """Anthropic counts cached input apart: input_tokens + cache_read_input_tokens = prompt."""
    usage = job.usage()
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": usage["prompt_tokens"] - cached,
        "output_tokens": usage["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _stop(job: Job, finish: str | None, called: bool) -> tuple[str, str | None]:
    """stop_reason and stop_sequence."""
    if finish == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    stop = matched_stop(job)
    return ("stop_sequence", stop) if stop is not None else ("end_turn", None)


def _tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        value = {}
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": value if isinstance(value, dict) else {},
    }


def _envelope(job: Job, model: str) -> dict[str, Any]:
    return {
        "id": f"msg_{job.rid}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }


def message_body(job: Job, model: str, text: str, finish: str | None) -> dict[str, Any]:
    parsed = (job.output or serving.PLAIN_OUTPUT).parse(text)
    content: list[dict[str, Any]] = []
    if parsed.reasoning:
        content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    if parsed.content or not parsed.calls:
        content.append({"type": "text", "text": parsed.content})
    content.extend(_tool_use(call) for call in parsed.calls)
    reason, sequence = _stop(job, finish, bool(parsed.calls))
    body = _envelope(job, model)
    body.update(content=content, stop_reason=reason, stop_sequence=sequence, usage=_usage(job))
    return body


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

    def feed(self, event: Any) -> list[bytes]:
        out: list[bytes] = []
        if isinstance(event, ContentDelta) and event.text:
            if self.kind != "text":
                out += self.open("text", {"type": "text", "text": ""})
            out.append(self.delta({"type": "text_delta", "text": event.text}))
        elif isinstance(event, ReasoningContentDelta) and event.text:
            if self.kind != "thinking":
                out += self.open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self.delta({"type": "thinking_delta", "thinking": event.text}))
        elif isinstance(event, ToolCallDelta):
            if event.id is not None or self.kind != "tool_use" or self.call != event.index:
                self.called = True
                block: dict[str, Any] = {"type": "tool_use", "id": event.id, "name": event.name}
                block["input"] = {}
                out += self.open("tool_use", block, event.index)
            if event.arguments:
                out.append(
                    self.delta({"type": "input_json_delta", "partial_json": event.arguments})
                )
        return out


async def message_events(job: Job, model: str) -> AsyncIterator[bytes]:
    """message_start, content blocks (start, ping, deltas, stop), message_delta, message_stop."""
    parser = (job.output or serving.PLAIN_OUTPUT).stream_parser()
    blocks = _Blocks()
    finish: str | None = None
    start = _envelope(job, model)
    prompt = job.usage()["prompt_tokens"]
    start["usage"] = {"input_tokens": prompt, "output_tokens": 0}
    try:
        yield _event("message_start", {"message": start})
        async for part in batches(job, Timing(job)):
            if isinstance(part, APIError):
                yield _event("error", {"error": error_body(part)["error"]})
                return
            for d in part:
                events = parser.feed(d.text) if d.text else []
                if d.finish_reason:
                    finish = d.finish_reason
                    events += parser.finish()
                for event in events:
                    for chunk in blocks.feed(event):
                        yield chunk
        if blocks.index < 0:  # an empty answer still has one (empty) text block
            for chunk in blocks.open("text", {"type": "text", "text": ""}):
                yield chunk
        for chunk in blocks.close():
            yield chunk
        reason, sequence = _stop(job, finish, blocks.called)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        yield _event("message_delta", {"delta": delta, "usage": _usage(job)})
        yield _event("message_stop", {})
    finally:
        job.close()


def error_body(err: APIError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(
        err.status, "api_error" if err.status >= 500 else "invalid_request_error"
    )
    return {"type": "error", "error": {"type": kind, "message": err.message}}


# ---- routes ----------------------------------------------------------------------------------


@post("/", summary="Anthropic Messages: create a message (SSE when stream: true)", status_code=200)
async def create_message(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body(), MessagesRequest, RENAMES)
    manager = state(request).ready_manager()
    req = chat_request(manager, body)
    job = await serving.chat_job(manager, req)
    model = str(req.model)
    try:
        if body.stream:
            await constraint_compiled(job)
            return ClosingStream(message_events(job, model), "text/event-stream")
        gathered = await gather(request, job)
    except BaseException:
        job.close()
        raise
    if gathered is None:
        return Response(b"", status_code=499)
    return json_response(message_body(job, model, gathered.text[0], gathered.finish[0]))


@post(
    "/count_tokens", summary="Anthropic Messages: count a request's input tokens", status_code=200
)
async def count_tokens(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body(), CountTokensRequest, RENAMES)
    manager = state(request).ready_manager()
    ids = chat_prompt_ids(manager, chat_request(manager, body))
    return json_response({"input_tokens": len(ids)})


ROUTES: list[ControllerRouterHandler] = [
    Router(
        "/v1/messages",
        route_handlers=[create_message, count_tokens],
        exception_handlers={Exception: error_handler(error_body)},
    )
]
