"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), which Claude-style
coding agents speak (`ANTHROPIC_BASE_URL`), over the request core (see core/).

Messages and blocks become the neutral chat request; the output comes back as content blocks,
streamed as Anthropic's typed SSE events. `usage.cache_read_input_tokens` is what the radix cache
served; `cache_control` breakpoints pin their prefix in it (cache_control.py), and
`cache_creation_input_tokens` is what those pins newly cached. Errors are `{"type": "error", "error": {"type", "message"}}`.
`GET /v1/models` (openai/routes.py) answers in Anthropic's shape when `speaks_anthropic`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from litestar import Request, Response, Router, post
from litestar.types import ControllerRouterHandler

from localradix.messages import CachePin
from localradix.server.anthropic.cache_control import breakpoints, cache_pins
from localradix.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from localradix.server.anthropic.render import error_body, message_body, model_page
from localradix.server.anthropic.request import chat_request
from localradix.server.anthropic.stream import message_events
from localradix.server.core.chat_template import chat_text
from localradix.server.core.docs import ANTHROPIC_ERRORS
from localradix.server.core.gather import Gathered
from localradix.server.core.http import error_handler, json_response
from localradix.server.core.jobs import chat_job, encode_prompt
from localradix.server.core.route import Rendered, run_route
from localradix.server.errors import APIError
from localradix.server.tokenizer_manager import TokenizerManager

DEFAULT_LIMIT, MAX_LIMIT = 20, 1000  # models a page of Anthropic's model list


@post(
    "/",
    summary="Anthropic Messages: create a message (SSE when stream: true)",
    status_code=200,
    responses=ANTHROPIC_ERRORS,
)
async def create_message(request: Request[Any, Any, Any]) -> Response[Any]:
    return await run_route(request, MessagesRequest, _create, b"{}")


async def _create(
    request: Request[Any, Any, Any], manager: TokenizerManager, body: MessagesRequest
) -> Rendered:
    chat = chat_request(manager, body)
    marks = breakpoints(body)
    job = await chat_job(
        manager, chat, pins_for=partial(cache_pins, manager, marks) if marks else None
    )
    model, pins = str(chat.model), job.pins
    events = partial(message_events, job, model, pins) if chat.stream else None
    return Rendered(job, events, partial(_message, model=model, pins=pins))


def _message(gathered: Gathered, model: str, pins: tuple[CachePin, ...]) -> dict[str, Any]:
    return message_body(gathered.job, model, gathered.text[0], gathered.finish[0], pins)


@post(
    "/count_tokens",
    summary="Anthropic Messages: count a request's input tokens",
    status_code=200,
    responses=ANTHROPIC_ERRORS,
)
async def count_tokens(request: Request[Any, Any, Any]) -> Response[Any]:
    return await run_route(request, CountTokensRequest, _count, b"{}")


async def _count(
    request: Request[Any, Any, Any], manager: TokenizerManager, body: CountTokensRequest
) -> Response[Any]:
    # The very prompt a message would send (not checked against the context: it is counted).
    ids = await encode_prompt(manager, chat_text(manager, chat_request(manager, body)))
    return json_response({"input_tokens": len(ids)})


def speaks_anthropic(request: Request[Any, Any, Any]) -> bool:
    """A request from Anthropic's clients: its API requires `anthropic-version` on every
    request and its SDKs always send it (x-api-key is no sign: other clients send it too)."""
    return "anthropic-version" in request.headers


def model_list(request: Request[Any, Any, Any], infos: list[dict[str, Any]]) -> dict[str, Any]:
    """`GET /v1/models` for Anthropic's clients: the page its query asks for."""
    query = request.query_params
    return model_page(infos, query.get("after_id"), query.get("before_id"), _limit(query))


def _limit(query: Mapping[str, str]) -> int:
    """Anthropic's `limit`: 1 to 1000 models a page, 20 if not given."""
    given = query.get("limit", str(DEFAULT_LIMIT))
    if not given.isdigit() or not 1 <= int(given) <= MAX_LIMIT:
        raise APIError(400, f"limit must be an integer from 1 to {MAX_LIMIT}", param="limit")
    return int(given)


ROUTES: list[ControllerRouterHandler] = [
    Router(
        "/v1/messages",
        route_handlers=[create_message, count_tokens],
        exception_handlers={Exception: error_handler(error_body)},
    )
]
