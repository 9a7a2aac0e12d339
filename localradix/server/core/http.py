"""HTTP plumbing every dialect's routes share: the server state, JSON and streamed responses,
waiting for a whole answer unless the client leaves, and errors in a dialect's shape."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import msgspec
from litestar import MediaType, Request, Response
from litestar.response import Stream
from litestar.response.streaming import ASGIStreamingResponse

from localradix.server.errors import APIError, handle_exception
from localradix.server.state import ServerState

encode_json = msgspec.json.Encoder().encode
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
CLIENT_GONE = 499  # nginx's "client closed request": nobody reads it, the log does


def sse(payload: Any) -> bytes:
    """One Server-Sent Event carrying `payload` as JSON."""
    return b"data: " + encode_json(payload) + b"\n\n"


def state(request: Request[Any, Any, Any]) -> ServerState:
    return request.app.state.server


def json_response(payload: Any, status: int = 200) -> Response[bytes]:
    return Response(encode_json(payload), status_code=status, media_type=MediaType.JSON)


def client_gone_response() -> Response[bytes]:
    return Response(b"", status_code=CLIENT_GONE)


class _ClosingStreamingResponse(ASGIStreamingResponse):
    """Closes the generator however the stream ends, so a vanished client aborts its job."""

    __slots__ = ()

    async def send_body(self, send: Any, receive: Any) -> None:
        try:
            await super().send_body(send, receive)
        finally:
            aclose = getattr(self.iterator, "aclose", None)
            if aclose is not None:
                await aclose()


class ClosingStream(Stream):
    """A streamed body whose generator is closed however the stream ends (SSE by default,
    NDJSON for Ollama)."""

    def __init__(self, content: AsyncIterator[bytes], media_type: str = SSE) -> None:
        super().__init__(
            content,
            media_type=media_type,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        response = super().to_asgi_response(*args, **kwargs)
        response.__class__ = _ClosingStreamingResponse
        return response


@contextlib.contextmanager
def closed_on_error(job: Any) -> Iterator[None]:
    """A job whose response could not be built is aborted, never left running."""
    try:
        yield
    except BaseException:
        job.close()
        raise


async def _client_gone(request: Request[Any, Any, Any]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request[Any, Any, Any], job: Any, work: Any) -> Any:
    """`work`'s result, or None (and the job aborted) if the client disconnects first."""
    done = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({done, watch}, return_when=asyncio.FIRST_COMPLETED)
        if done.done():
            return done.result()
        job.close()
        return None
    finally:
        done.cancel()
        watch.cancel()


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
