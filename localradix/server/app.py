"""The Litestar application: OpenAI routes, health, metrics, the stats feed and the lifecycle.

`create_app(args)` returns the app; its startup spawns the engine process and loads the
tokenizer (in parallel), its shutdown stops the engine. `ServerState` (at `app.state.server`)
holds everything a route needs. Who may call which route is decided in security.py.

Shutdown (SIGTERM/SIGINT, see launch.py) drains: new requests get 503 with Retry-After while
the ones in flight get up to --drain-timeout seconds; whatever still runs then ends with a
clear 503 (an SSE error event and `[DONE]` for a stream), and only then does uvicorn stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import msgspec
from litestar import Litestar, MediaType, Request, Response, Router, get, post
from litestar.exceptions import NotAuthorizedException
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.response import Stream
from litestar.response.streaming import ASGIStreamingResponse

import localradix
from localradix.config import ServerArgs
from localradix.server import serving
from localradix.server.engine_client import EngineClient
from localradix.server.engine_process import DEFAULT_CORE
from localradix.server.errors import APIError, error_response, from_decode_error, handle_exception
from localradix.server.metrics import ServerMetrics
from localradix.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    request_schemas,
)
from localradix.server.security import AccessPolicy, access_middleware, resolve_api_key
from localradix.server.tokenizer_manager import TokenizerManager

logger = logging.getLogger("localradix.server")

DEATH_GRACE_S = 2.0  # keep answering 503 this long after the engine died, then exit non-zero
STATS_STREAM_INTERVAL_S = 0.25
ABORT_FLUSH_S = 5.0  # after the drain deadline: time for the aborted responses to go out
SHUTDOWN_RETRY_AFTER_S = 5
SHUTTING_DOWN = "the server is shutting down; retry on a server that is running"
# Prompt text in the stats feed (engine.top_prefixes / engine.recent_misses).
PREVIEW_KEYS = {
    "top_prefixes": ("preview", "head"),
    "recent_misses": ("cached_text", "request_text", "before_text"),
}


def default_tokenizer(args: ServerArgs) -> Any:
    from localradix.loader.tokenizer import load_tokenizer

    return load_tokenizer(args.model)


class ServerState:
    def __init__(
        self,
        args: ServerArgs,
        core_factory: str = DEFAULT_CORE,
        tokenizer_factory: Callable[[ServerArgs], Any] = default_tokenizer,
    ) -> None:
        self.args = args
        self.client = EngineClient(args, core_factory)
        self.tokenizer_factory = tokenizer_factory
        self.metrics = ServerMetrics()
        self.manager: TokenizerManager | None = None
        self.started = time.time()
        self.exit_code = 0
        self.startup_error: str | None = None
        self.request_exit: Callable[[], None] = lambda: None  # set by whoever runs the server
        self.is_exiting: Callable[[], bool] = lambda: False
        self.draining = False
        self.active = 0  # POST requests being answered (the work a shutdown drains)
        self._idle = asyncio.Event()
        self._idle.set()
        self._stop_now = asyncio.Event()
        self._drain: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        tok = asyncio.ensure_future(asyncio.to_thread(self.tokenizer_factory, self.args))
        eng = asyncio.ensure_future(self.client.start())
        try:
            tokenizer, info = await asyncio.gather(tok, eng)
        except BaseException as exc:
            for task in (tok, eng):
                task.cancel()
            self.client.close_sync()
            self.startup_error = str(exc) or type(exc).__name__
            self.exit_code = 1
            logger.error("startup failed: %s", self.startup_error)
            raise
        self.manager = TokenizerManager(self.client, tokenizer, self.args, self.metrics)
        self.client.on_death.append(self._engine_died)
        logger.info("serving '%s' on http://%s:%d", info["name"], self.args.host, self.args.port)

    async def stop(self) -> None:
        await self.client.close()

    def _engine_died(self, message: str) -> None:
        self.exit_code = 1
        asyncio.get_running_loop().call_later(DEATH_GRACE_S, self.request_exit)

    def ready_manager(self) -> TokenizerManager:
        if self.draining:
            raise APIError(503, SHUTTING_DOWN, headers={"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)})
        if self.manager is None or not self.client.alive:
            raise APIError(503, self.client.dead_message or "the server is still starting")
        return self.manager

    # ---- shutdown: drain, then stop ------------------------------------------------------

    def request_shutdown(self) -> bool:
        """From a signal handler: start the drain, or (a second signal) end it now. False
        before the server started (the caller then exits the usual way)."""
        if self._loop is None or self.manager is None:
            return False
        self._loop.call_soon_threadsafe(self._shutdown_requested)
        return True

    def _shutdown_requested(self) -> None:
        if self._drain is None:
            self.draining = True
            self._drain = asyncio.ensure_future(self._drain_then_exit())
        else:
            self._stop_now.set()

    async def _drain_then_exit(self) -> None:
        timeout = self.args.drain_timeout
        if self.active:
            logger.info(
                "shutting down: %d request(s) in flight get up to %g s to finish; new requests "
                "get 503 (signal again to end them now)",
                self.active,
                timeout,
            )
        if not await self._until_idle(timeout, stoppable=True):
            logger.warning("shutting down: ending %d request(s) with a 503 error", self.active)
            self.client.stop_serving(SHUTTING_DOWN)
            await self._until_idle(ABORT_FLUSH_S)
        logger.info("shutting down")
        self.request_exit()

    async def _until_idle(self, timeout: float, stoppable: bool = False) -> bool:
        waits = [asyncio.ensure_future(self._idle.wait())]
        if stoppable:
            waits.append(asyncio.ensure_future(self._stop_now.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return self.active == 0

    def enter(self) -> None:
        self.active += 1
        self._idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    def stats_payload(self, previews: bool = True) -> dict[str, Any]:
        stats = self.client.stats
        m = self.metrics
        return {
            "model": self.client.info,
            "uptime_s": time.time() - self.started,
            "engine_alive": self.client.alive,
            "engine_pid": self.client.pid,
            "draining": self.draining,
            "engine": stats if stats is None or previews else _without_previews(stats),
            "server": {
                "in_flight": self.manager.in_flight if self.manager else 0,
                "requests_total": sum(m.requests.values()),
                "requests_by_finish_reason": m.requests,
                "errors_by_status": m.errors,
                "prompt_tokens_total": m.prompt_tokens,
                "generated_tokens_total": m.generated_tokens,
                "cached_tokens_total": m.cached_tokens,
                "cache_hit_rate": m.cache_hit_rate,
            },
            "throughput": {
                "prefill_tokens_per_s": stats.prefill_tokens_per_s if stats else 0.0,
                "decode_tokens_per_s": stats.decode_tokens_per_s if stats else 0.0,
            },
        }


def _without_previews(stats: Any) -> dict[str, Any]:
    data = msgspec.to_builtins(stats)
    for table, keys in PREVIEW_KEYS.items():
        data[table] = [{k: v for k, v in row.items() if k not in keys} for row in data[table]]
    return data


def _state(request: Request[Any, Any, Any]) -> ServerState:
    return request.app.state.server


def _previews(request: Request[Any, Any, Any]) -> bool:
    return bool(request.app.state.policy.shows_previews(request.scope))


def _json(payload: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(payload), status_code=status, media_type=MediaType.JSON)


def _decode(body: bytes, type_: type) -> Any:
    try:
        return msgspec.json.decode(body, type=type_, strict=True)
    except msgspec.ValidationError:
        pass  # maybe an integer written as 2.0: JSON Schema (and clients) call that an integer
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from None
    try:
        return msgspec.convert(_integral_floats_as_ints(msgspec.json.decode(body)), type_)
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from None


def _integral_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(v) for v in value]
    return value


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


class EventStream(Stream):
    def __init__(self, content: AsyncIterator[bytes]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        response = super().to_asgi_response(*args, **kwargs)
        response.__class__ = _ClosingStreamingResponse
        return response


@contextlib.contextmanager
def _closed_on_error(job: Any) -> Iterator[None]:
    """A job whose response could not be built is aborted, never left running."""
    try:
        yield
    except BaseException:
        job.close()
        raise


async def _client_gone(request: Request[Any, Any, Any]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _gather_unless_disconnected(
    request: Request[Any, Any, Any], job: Any, gathered: type[serving.Gathered] = serving.Gathered
) -> Any:
    """The finished job (a `gathered`), or None (and the job aborted) if the client
    disconnects first."""
    gather = asyncio.ensure_future(gathered(job).run())
    watch = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({gather, watch}, return_when=asyncio.FIRST_COMPLETED)
        if gather.done():
            return gather.result()
        job.close()
        return None
    finally:
        gather.cancel()
        watch.cancel()


async def _constraint_compiled(job: Any) -> None:
    """Hold a constrained stream's headers until the engine's first output, so a grammar that
    does not compile is a plain 400 rather than an SSE error event after a 200."""
    if job.params.constraint is not None:
        await job.first_output()


# Every status a route can answer is declared, so the published schema holds no surprises.
_AUTH = {401: ResponseSpec(ErrorResponse, description="Missing or wrong API key (--api-key)")}
_UNAVAILABLE = {503: ResponseSpec(ErrorResponse, description="Engine unavailable")}
_UNKNOWN_MODEL = {404: ResponseSpec(ErrorResponse, description="Unknown model")}
_ERRORS = {
    400: ResponseSpec(ErrorResponse, description="Invalid request"),
    **_AUTH,
    **_UNKNOWN_MODEL,
    413: ResponseSpec(ErrorResponse, description="Request body too large"),
    429: ResponseSpec(ErrorResponse, description="Queue full (see Retry-After)"),
    **_UNAVAILABLE,
}


@post(
    "/chat/completions",
    summary="Create a chat completion",
    responses={
        200: ResponseSpec(ChatCompletionResponse, description="The completion (or SSE)"),
        **_ERRORS,
    },
    status_code=200,
)
async def chat_completions(
    request: Request[Any, Any, Any], data: ChatCompletionRequest
) -> Response[Any]:
    server = _state(request)
    req = _decode(await request.body(), ChatCompletionRequest)
    job = await serving.chat_job(server.ready_manager(), req)
    model = server.client.info["name"]
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    with _closed_on_error(job):
        if req.stream:
            await _constraint_compiled(job)
            return EventStream(serving.chat_stream(job, model, req.logprobs, include_usage))
        gathered = await _gather_unless_disconnected(request, job)
        if gathered is None:
            return Response(b"", status_code=499)
        return _json(serving.chat_response(gathered, model, req.logprobs))


@post(
    "/completions",
    summary="Create a text completion",
    responses={
        200: ResponseSpec(CompletionResponse, description="The completion (or SSE)"),
        **_ERRORS,
    },
    status_code=200,
)
async def completions(request: Request[Any, Any, Any], data: CompletionRequest) -> Response[Any]:
    server = _state(request)
    req = _decode(await request.body(), CompletionRequest)
    manager = server.ready_manager()
    job = await serving.completion_job(manager, req)
    model = server.client.info["name"]
    with _closed_on_error(job):
        decode = manager.tokenizer.decode
        texts = [decode(p, skip_special_tokens=False) for p in job.prompts] if req.echo else []
        if req.stream:
            await _constraint_compiled(job)
            return EventStream(serving.completion_stream(job, model, req, texts))
        gathered = await _gather_unless_disconnected(request, job)
        if gathered is None:
            return Response(b"", status_code=499)
        return _json(serving.completion_response(gathered, model, req, texts))


@get(
    "/models",
    summary="List the served model",
    responses={200: ResponseSpec(ModelList), **_AUTH, **_UNAVAILABLE},
)
async def list_models(request: Request[Any, Any, Any]) -> Response[Any]:
    return _json({"object": "list", "data": [_model_card(_state(request))]})


@get(
    "/models/{model_id:path}",
    summary="Describe the served model",
    responses={200: ResponseSpec(ModelCard), **_AUTH, **_UNKNOWN_MODEL, **_UNAVAILABLE},
)
async def get_model(request: Request[Any, Any, Any], model_id: str) -> Response[Any]:
    server = _state(request)
    card = _model_card(server)
    if model_id.lstrip("/") != card["id"]:
        raise APIError(
            404,
            f"the model '{model_id.lstrip('/')}' does not exist",
            param="model",
            code="model_not_found",
            type="invalid_request_error",
        )
    return _json(card)


def _model_card(server: ServerState) -> dict[str, Any]:
    server.ready_manager()
    info = server.client.info
    return {
        "id": info["name"],
        "object": "model",
        "created": int(server.started),
        "owned_by": "localradix",
        "max_model_len": info["context_length"],
    }


@get("/stats", summary="Engine and server statistics (JSON)")
async def stats(request: Request[Any, Any, Any]) -> Response[Any]:
    return _json(_state(request).stats_payload(_previews(request)))


@get("/stats/stream", summary="The statistics as Server-Sent Events, about 4 per second")
async def stats_stream(request: Request[Any, Any, Any]) -> Stream:
    server = _state(request)
    previews = _previews(request)

    async def events() -> AsyncIterator[bytes]:
        while not server.is_exiting():
            yield serving.sse(server.stats_payload(previews))
            await asyncio.sleep(STATS_STREAM_INTERVAL_S)

    return EventStream(events())


@post(
    "/cache/flush",
    summary="Drop every cached prefix (409 while requests run)",
    status_code=200,
    responses={
        **_AUTH,
        409: ResponseSpec(ErrorResponse, description="Requests are running"),
        **_UNAVAILABLE,
    },
)
async def flush_cache(request: Request[Any, Any, Any]) -> Response[Any]:
    server = _state(request)
    manager = server.ready_manager()
    if manager.in_flight or not await server.client.flush_cache():
        raise APIError(
            409, "cannot flush the cache while requests are running; retry when idle", code="busy"
        )
    return _json({"flushed": True})


@get(
    "/health",
    summary="200 while the engine runs, 503 otherwise",
    responses={503: ResponseSpec(ErrorResponse, description="Starting, or the engine is gone")},
)
async def health(request: Request[Any, Any, Any]) -> Response[Any]:
    server = _state(request)
    if server.draining:
        return error_response(
            APIError(503, SHUTTING_DOWN, headers={"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)})
        )
    if not server.client.alive:
        return error_response(
            APIError(503, server.client.dead_message or "the server is still starting")
        )
    return _json({"status": "ok", "model": server.client.info["name"]})


@get("/metrics", summary="Prometheus metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any]) -> Response[Any]:
    server = _state(request)
    in_flight = server.manager.in_flight if server.manager else 0
    text = server.metrics.render(server.client.stats, in_flight, server.client.alive)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


def _counting(server: ServerState) -> Callable[[Any], Any]:
    """Middleware counting the POST requests being answered, which a shutdown drains (a
    stream counts until its last byte is sent)."""

    def middleware(app: Any) -> Any:
        async def counted(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["method"] != "POST":
                await app(scope, receive, send)
                return
            server.enter()
            try:
                await app(scope, receive, send)
            finally:
                server.leave()

        return counted

    return middleware


def create_app(
    args: ServerArgs,
    *,
    core_factory: str = DEFAULT_CORE,
    tokenizer_factory: Callable[[ServerArgs], Any] = default_tokenizer,
) -> Litestar:
    from localradix.server import anthropic, ollama  # they import this module

    server = ServerState(args, core_factory, tokenizer_factory)
    policy = AccessPolicy.from_args(args, resolve_api_key(args))
    v1 = Router(
        "/v1",
        route_handlers=[
            chat_completions,
            completions,
            list_models,
            get_model,
            stats,
            stats_stream,
            flush_cache,
        ],
    )

    def on_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        response = handle_exception(request, exc)
        server.metrics.record_error(response.status_code or 500)
        return response

    app = Litestar(
        route_handlers=[v1, health, metrics, *ollama.ROUTES, *anthropic.ROUTES],
        on_startup=[server.start],
        on_shutdown=[server.stop],
        middleware=[access_middleware(policy, server.metrics.record_error), _counting(server)],
        exception_handlers={Exception: on_error, NotAuthorizedException: on_error},
        openapi_config=OpenAPIConfig(
            title="localradix",
            version=localradix.__version__ if hasattr(localradix, "__version__") else "0",
            description="OpenAI-compatible LLM server with a radix-tree prefix cache",
        ),
        request_max_body_size=args.max_body_bytes,
        logging_config=None,
        debug=False,
    )
    app.state.server = server
    app.state.policy = policy
    # The OpenAPI document is built once and cached: publish msgspec's request schemas in it.
    app.openapi_schema.components.schemas.update(request_schemas())
    return app
