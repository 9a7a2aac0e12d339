"""The operator's routes: health, Prometheus metrics, the stats feed (JSON and SSE, which the
TUI reads), flushing the prefix cache, and the load report a gateway (smg) polls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, get, post
from litestar.openapi import ResponseSpec
from litestar.response import Stream

from localradix.server.core.docs import AUTH, UNAVAILABLE
from localradix.server.core.http import ClosingStream, json_response, sse, state
from localradix.server.errors import APIError, error_response
from localradix.server.loads import load_report
from localradix.server.protocol import ErrorResponse
from localradix.server.resident import State

STATS_STREAM_INTERVAL_S = 0.25


def _previews(request: Request[Any, Any, Any]) -> bool:
    return bool(request.app.state.policy.shows_previews(request.scope))


@get("/stats", summary="Engine and server statistics (JSON)", responses=AUTH)
async def stats(request: Request[Any, Any, Any]) -> Response[Any]:
    return json_response(state(request).stats_payload(_previews(request)))


@get(
    "/stats/stream",
    summary="The statistics as Server-Sent Events, about 4 per second",
    responses=AUTH,
)
async def stats_stream(request: Request[Any, Any, Any]) -> Stream:
    server = state(request)
    previews = _previews(request)

    async def events() -> AsyncIterator[bytes]:
        while not server.is_exiting():
            yield sse(server.stats_payload(previews))
            await asyncio.sleep(STATS_STREAM_INTERVAL_S)

    return ClosingStream(events())


FLUSH_RESPONSES = {
    **AUTH,
    409: ResponseSpec(ErrorResponse, description="Requests are running"),
    **UNAVAILABLE,
}


@post(
    "/cache/flush",
    summary="Drop every cached prefix (409 while requests run)",
    status_code=200,
    responses=FLUSH_RESPONSES,
)
async def flush_cache(request: Request[Any, Any, Any]) -> Response[Any]:
    return await _flush(request)


@post(
    "/flush_cache",
    summary="Drop every cached prefix (SGLang's and smg's name for /v1/cache/flush)",
    status_code=200,
    responses=FLUSH_RESPONSES,
)
async def flush_cache_smg(request: Request[Any, Any, Any]) -> Response[Any]:
    return await _flush(request)


async def _flush(request: Request[Any, Any, Any]) -> Response[Any]:
    """Every loaded model's cache (each has its own)."""
    server = state(request)
    server.ready_manager()
    managers = [r.manager for r in server.pool.residents if r.state == State.READY and r.manager]
    for manager in managers:
        if manager.in_flight or not await manager.client.flush_cache():
            raise APIError(
                409,
                "cannot flush the cache while requests are running; retry when idle",
                code="busy",
            )
    return json_response({"flushed": True})


@get(
    "/health",
    summary="200 while the default model's engine runs (503 otherwise), with every model's state",
    responses={503: ResponseSpec(ErrorResponse, description="Starting, or the engine is gone")},
)
async def health(request: Request[Any, Any, Any]) -> Response[Any]:
    server = state(request)
    err = server.unavailable()
    if err is not None:
        return error_response(err)
    models = {m["name"]: m["state"] for m in server.pool.describe()}
    return json_response(
        {
            "status": "ok",
            "model": server.client.loaded.name,
            "models": models,
            "engine_restarts": server.engine_restarts,
        }
    )


@get("/metrics", summary="Prometheus metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any]) -> Response[Any]:
    server = state(request)
    in_flight = server.manager.in_flight if server.manager else 0
    text = server.metrics.render(server.client.stats, in_flight, server.client.alive)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


@get(
    "/loads",
    summary="The engine's load in smg's schema (one data-parallel rank)",
    responses={**AUTH, **UNAVAILABLE},
)
async def loads(request: Request[Any, Any, Any]) -> Response[Any]:
    server = state(request)
    server.ready_manager()
    return json_response(load_report(server))


V1_ROUTES = [stats, stats_stream, flush_cache, loads]  # under /v1, beside the OpenAI routes
ROUTES = [health, metrics, flush_cache_smg]
