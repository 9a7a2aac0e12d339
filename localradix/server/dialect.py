"""What the Ollama and Anthropic routes share with the OpenAI ones: one request core.

A dialect turns its request into an OpenAI `ChatCompletionRequest` / `CompletionRequest` (so
validation, limits, sampling, grammar and tool parsing are the OpenAI routes' own), runs the job,
and renders the outputs and errors in its own shape. Imported by `create_app`, after app.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from litestar import MediaType, Request, Response
from litestar.response import Stream

from localradix.server import serving
from localradix.server.app import (
    ServerState,
    _ClosingStreamingResponse,
    _gather_unless_disconnected,
)
from localradix.server.errors import APIError, from_decode_error, handle_exception
from localradix.server.protocol import ChatCompletionRequest
from localradix.server.tokenizer_manager import Delta, Job, TokenizerManager

encode_json = msgspec.json.Encoder().encode


def state(request: Request[Any, Any, Any]) -> ServerState:
    return request.app.state.server


def json_response(payload: Any, status: int = 200) -> Response[bytes]:
    return Response(encode_json(payload), status_code=status, media_type=MediaType.JSON)


def decode(body: bytes, type_: type, renames: dict[str, str] | None = None) -> Any:
    """Strict JSON decode; unknown keys are ignored, a wrong type is a 400 naming the field."""
    try:
        return msgspec.json.decode(body or b"{}", type=type_, strict=True)
    except msgspec.MsgspecError as exc:
        raise renamed(from_decode_error(exc), renames or {}) from None


def convert(fields: dict[str, Any], type_: type, renames: dict[str, str]) -> Any:
    """The dialect's fields as an OpenAI request Struct (type-checked as if sent as JSON)."""
    try:
        return msgspec.convert(fields, type_, strict=True)
    except msgspec.MsgspecError as exc:
        raise renamed(from_decode_error(exc), renames) from None


def renamed(err: APIError, renames: dict[str, str]) -> APIError:
    """An error about an OpenAI field, reworded with the dialect's name for it."""
    for ours, theirs in renames.items():
        # 'stop', 'stop[0]', 'response_format.json_schema': the field, alone or as a prefix
        err.message = re.sub(rf"'{re.escape(ours)}(?=['\[.])", f"'{theirs}", err.message)
        if err.param is not None and re.match(rf"{re.escape(ours)}(?![\w])", err.param):
            err.param = theirs + err.param[len(ours) :]
    return err


def as_api_error(request: Request[Any, Any, Any], exc: Exception) -> APIError:
    """Any failure as the APIError the OpenAI routes would have answered with."""
    if isinstance(exc, APIError):
        return exc
    response = handle_exception(request, exc)
    body = response.content if isinstance(response.content, dict) else {}
    message = body.get("error", {}).get("message", "internal server error")
    return APIError(response.status_code or 500, message, headers=dict(response.headers))


def error_handler(
    render: Callable[[APIError], Any],
) -> Callable[[Request[Any, Any, Any], Exception], Response[Any]]:
    """A Litestar exception handler answering in a dialect's error shape (and counting it)."""

    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        err = as_api_error(request, exc)
        state(request).metrics.record_error(err.status)
        return Response(
            encode_json(render(err)),
            status_code=err.status,
            headers=err.headers,
            media_type=MediaType.JSON,
        )

    return handle


class ClosingStream(Stream):
    """A streamed body whose generator is closed however the stream ends (a vanished client
    aborts its job), in any media type (NDJSON for Ollama, SSE for Anthropic)."""

    def __init__(self, content: AsyncIterator[bytes], media_type: str) -> None:
        super().__init__(
            content,
            media_type=media_type,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        response = super().to_asgi_response(*args, **kwargs)
        response.__class__ = _ClosingStreamingResponse
        return response


def check_model(manager: TokenizerManager, model: str | None, latest_ok: bool = False) -> str:
    """The served model's name; 404 if `model` names another (`:latest` is Ollama's tag)."""
    served = str(manager.client.info["name"])
    if model is None or model == served or (latest_ok and model == f"{served}:latest"):
        return served
    raise APIError(404, f"model '{model}' not found; this server serves '{served}'")


def chat_prompt_ids(manager: TokenizerManager, req: ChatCompletionRequest) -> list[int]:
    """The token ids `serving.chat_job` would send, without sending them (count_tokens)."""
    try:
        text = manager.tokenizer.apply_chat_template(
            serving.chat_messages(req), tools=req.tools, add_generation_prompt=True
        )
    except APIError:
        raise
    except Exception as exc:  # the template is the model's code; any failure is the input's
        raise APIError(400, f"the chat template could not render these messages: {exc}") from None
    return list(manager.tokenizer.encode(text, False))


async def constraint_compiled(job: Job) -> None:
    """Hold a constrained stream's headers until the engine's first output, so a grammar that
    does not compile is a plain 400 rather than an error inside a 200 stream."""
    if job.params.constraint is not None:
        await job.first_output()


class Timing:
    """When a job started, produced its first token and ended (monotonic seconds)."""

    def __init__(self, job: Job) -> None:
        self.start = job.start
        self.first: float | None = None
        self.end: float | None = None

    def saw(self, batch: list[Delta]) -> None:
        if self.first is None and any(d.text or d.finish_reason for d in batch):
            self.first = time.monotonic()

    def done(self) -> None:
        self.end = time.monotonic()
        if self.first is None:
            self.first = self.end


class Gathered(serving.Gathered):
    """A finished job's outputs and when they came."""

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        self.timing = Timing(job)

    async def run(self) -> Gathered:
        async for batch in self.job.deltas():
            self.timing.saw(batch)
            for d in batch:
                self.text[d.index] += d.text
                if d.finish_reason:
                    self.finish[d.index] = d.finish_reason
        self.timing.done()
        return self


async def gather(request: Request[Any, Any, Any], job: Job) -> Gathered | None:
    """The finished job, or None (and the job aborted) if the client disconnects first."""
    return await _gather_unless_disconnected(request, job, Gathered)


async def batches(job: Job, timing: Timing) -> AsyncIterator[list[Delta] | APIError]:
    """The job's batches; an error after the headers went out is yielded, not raised."""
    try:
        async for batch in job.deltas():
            timing.saw(batch)
            yield batch
    except APIError as exc:
        job.manager.metrics.record_error(exc.status)
        yield exc
    timing.done()


def matched_stop(job: Job, index: int = 0) -> str | None:
    """The stop string that ended a choice, if one did (the text after what was emitted)."""
    detok = job.choices[index].detok
    if not detok.stopped:
        return None
    rest = detok.text[detok.emitted :]
    return next((s for s in job.params.stop if rest.startswith(s)), None)
