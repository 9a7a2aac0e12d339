"""The Litestar application: every dialect's routes over one request core, assembled.

`create_app(args)` returns the app; `ServerState` (state.py, at `app.state.server`) holds what a
route needs and runs the lifecycle. Who may call which route is decided in security.py; each
dialect answers errors in its own shape (the OpenAI one by default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import Litestar, Router
from litestar.exceptions import NotAuthorizedException
from litestar.openapi import OpenAPIConfig

import localradix
from localradix.config import ServerArgs
from localradix.server import anthropic, infill, ollama, openai, ops, responses, tokenize
from localradix.server.core.docs import (
    NDJSON,
    SSE,
    publish_link,
    publish_request_bodies,
    publish_streams,
)
from localradix.server.core.http import error_handler
from localradix.server.engine_process import DEFAULT_CORE
from localradix.server.errors import APIError
from localradix.server.model_pool import LEASES
from localradix.server.openai.routes import REQUEST_BODIES
from localradix.server.security import AccessPolicy, access_middleware, resolve_api_keys
from localradix.server.state import ServerState, default_tokenizer

__all__ = ["create_app", "default_tokenizer"]


def _counting(server: ServerState) -> Callable[[Any], Any]:
    """Middleware counting the POST requests being answered, which a shutdown drains (a
    stream counts until its last byte is sent); then it lets go of the models they used."""

    def middleware(app: Any) -> Any:
        async def counted(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["method"] != "POST":
                await app(scope, receive, send)
                return
            server.enter()
            try:
                await app(scope, receive, send)
            finally:
                for release in scope.pop(LEASES, ()):
                    release()
                server.leave()

        return counted

    return middleware


def dialect_error_body(path: str, err: APIError) -> Any:
    """An error in the shape of the dialect that `path` belongs to (for refusals made before
    routing, which the routers' own exception handlers never see)."""
    if path == "/api" or path.startswith("/api/"):
        return ollama.ollama_error(err)
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return anthropic.error_body(err)
    return err.body()


def _dialect_bodies() -> dict[str, type]:
    """The bodies the other dialects' routes decode (their own Structs), for the schema."""
    from localradix.server.anthropic.protocol import CountTokensRequest, MessagesRequest
    from localradix.server.infill import InfillBody
    from localradix.server.ollama.embed import EmbedBody, EmbeddingsBody
    from localradix.server.ollama.protocol import ChatBody, GenerateBody, ModelBody
    from localradix.server.ollama.store import DeleteBody, PullBody
    from localradix.server.responses.protocol import ResponsesRequest

    return {
        "/api/chat": ChatBody,
        "/api/generate": GenerateBody,
        "/api/embed": EmbedBody,
        "/api/embeddings": EmbeddingsBody,
        "/api/show": ModelBody,
        "/api/pull": PullBody,
        "/api/delete": DeleteBody,
        "/v1/messages": MessagesRequest,
        "/v1/messages/count_tokens": CountTokensRequest,
        "/v1/responses": ResponsesRequest,
        "/infill": InfillBody,
    }


_DIALECT_BODIES = _dialect_bodies()
STREAMS = {  # the routes that stream (on request, or Ollama's by default) and how
    "/v1/chat/completions": SSE,
    "/v1/completions": SSE,
    "/v1/responses": SSE,
    "/v1/messages": SSE,
    "/infill": SSE,
    "/v1/stats/stream": SSE,
    "/api/chat": NDJSON,
    "/api/generate": NDJSON,
    "/api/pull": NDJSON,
}


def create_app(
    args: ServerArgs,
    *,
    core_factory: str = DEFAULT_CORE,
    tokenizer_factory: Callable[[ServerArgs], Any] = default_tokenizer,
) -> Litestar:
    server = ServerState(args, core_factory, tokenizer_factory)
    policy = AccessPolicy.from_args(args, resolve_api_keys(args))
    v1 = Router("/v1", route_handlers=[*openai.ROUTES, *ops.V1_ROUTES, *responses.ROUTES])
    on_error = error_handler(APIError.body)
    app = Litestar(
        route_handlers=[
            v1,
            *ops.ROUTES,
            *infill.ROUTES,
            *tokenize.ROUTES,
            *ollama.ROUTES,
            *anthropic.ROUTES,
        ],
        on_startup=[server.start],
        on_shutdown=[server.stop],
        middleware=[
            access_middleware(policy, server.metrics.record_error, dialect_error_body),
            _counting(server),
        ],
        exception_handlers={Exception: on_error, NotAuthorizedException: on_error},
        openapi_config=OpenAPIConfig(
            title="localradix",
            version=getattr(localradix, "__version__", "0"),
            description="OpenAI-compatible LLM server with a radix-tree prefix cache",
        ),
        request_max_body_size=args.max_body_bytes,
        logging_config=None,
        debug=False,
    )
    app.state.server = server
    app.state.policy = policy
    publish_request_bodies(app, {**REQUEST_BODIES, **tokenize.REQUEST_BODIES, **_DIALECT_BODIES})
    publish_streams(app, STREAMS)
    publish_link(app, "/v1/responses", "id", "/v1/responses/{response_id}", "response_id")
    return app
