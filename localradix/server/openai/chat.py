"""Chat completions rendered: one choice per output, as a whole message or as stream deltas.

Both read the same parse of the output (reasoning, content, tool calls), the same logprobs and
the same finish reason (render.py); only their framing differs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from localradix.parsers.events import ToolCall as ParsedCall
from localradix.parsers.events import ToolCallDelta as ParsedCallDelta
from localradix.server.core.gather import Gathered
from localradix.server.core.http import sse
from localradix.server.core.output import output_spec
from localradix.server.core.parsed import ParsedDelta, ParsedStream, Split, split
from localradix.server.errors import APIError
from localradix.server.openai.render import (
    SSE_DONE,
    chat_logprobs,
    finish_reason,
    sse_error,
    usage,
)
from localradix.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from localradix.server.tokenizer_manager import Job


def chat_response(g: Gathered, model: str, want_logprobs: bool) -> ChatCompletionResponse:
    job = g.job
    spec = output_spec(job)
    choices = []
    for d in g.as_deltas():
        parsed = spec.parse(d.text)
        calls = [_tool_call(call) for call in parsed.calls] or None
        content = None if calls and not parsed.content.strip() else parsed.content
        message = AssistantMessage("assistant", content, parsed.reasoning, calls)
        lp = chat_logprobs(job.manager, d.logprobs) if want_logprobs else None
        choices.append(
            ChatChoice(d.index, message, lp, finish_reason(d.finish_reason, bool(calls)))
        )
    return ChatCompletionResponse(
        id=f"chatcmpl-{job.rid}",
        object="chat.completion",
        created=job.created,
        model=model,
        choices=choices,
        usage=usage(job),
    )


def _tool_call(call: ParsedCall) -> ToolCall:
    return ToolCall(id=call.id, function=FunctionCall(call.name, call.arguments))


async def chat_stream(
    job: Job, model: str, want_logprobs: bool, include_usage: bool
) -> AsyncIterator[bytes]:
    """The first chunk names the role; then deltas as the parsers release them; usage last."""

    def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> bytes:
        return sse(
            ChatCompletionChunk(
                id=f"chatcmpl-{job.rid}",
                object="chat.completion.chunk",
                created=job.created,
                model=model,
                choices=choices,
                usage=usage,
            )
        )

    stream = ParsedStream(job)
    called: set[int] = set()  # choices that emitted a tool call

    def choice(d: ParsedDelta) -> ChatChunkChoice | None:
        delta = chat_delta(split(d.events))
        if delta.tool_calls:
            called.add(d.index)
        lp = chat_logprobs(job.manager, d.logprobs) if want_logprobs and d.logprobs else None
        finish = finish_reason(d.finish_reason, d.index in called)
        if delta == ChatDelta() and not finish:
            if lp is None:
                return None  # the parser holds the text back (a tag may be starting)
            delta = ChatDelta(content="")
        return ChatChunkChoice(d.index, delta, lp, finish)

    try:
        start = ChatDelta(role="assistant", content="")
        yield chunk([ChatChunkChoice(c.index, start, None, None) for c in job.choices])
        async for part in stream.deltas():
            if isinstance(part, APIError):
                yield sse_error(part)
                return
            live = [d for d in part if d.text or d.logprobs or d.finish_reason]
            choices = [c for d in live if (c := choice(d)) is not None]
            if choices:
                yield chunk(choices)
        if include_usage:
            yield chunk([], usage(job))
        yield SSE_DONE
    finally:
        job.close()  # a client that went away mid-stream aborts what is left


def chat_delta(parsed: Split) -> ChatDelta:
    """One `choices[].delta` from a choice's parsed delta: reasoning_content, content,
    tool_calls."""
    calls = [_call_delta(call) for call in parsed.calls] or None
    return ChatDelta(content=parsed.content, reasoning_content=parsed.reasoning, tool_calls=calls)


def _call_delta(event: ParsedCallDelta) -> ToolCallDelta:
    if event.id is None:
        return ToolCallDelta(event.index, FunctionCallDelta(event.arguments))
    function = FunctionCallDelta(event.arguments, event.name)
    return ToolCallDelta(event.index, function, event.id, "function")
