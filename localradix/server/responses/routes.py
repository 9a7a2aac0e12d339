"""OpenAI's Responses API (`POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`), which the
current openai SDK leads with, over the request core (see core/).

Input items become chat messages; the output comes back as output items, streamed as the
typed SSE events. `previous_response_id` continues a kept response (store.py): the prompt is
rendered again from the kept conversation, and the engine must serve the shared prefix from
the radix cache; when the cache evicted it, or the id is unknown, the answer is a 400 telling
the client to send the whole input. Errors are OpenAI's shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from litestar import HttpMethod, Request, Response, Router, delete, get, post, route
from litestar.openapi import ResponseSpec
from litestar.types import ControllerRouterHandler

from localradix.messages import ErrorCode
from localradix.server.core.docs import AUTH, ERRORS
from localradix.server.core.gather import Gathered
from localradix.server.core.http import closed_on_error, json_response
from localradix.server.core.jobs import chat_job
from localradix.server.core.output import output_spec
from localradix.server.core.route import Rendered, run_route
from localradix.server.core.served import openai_not_found, served_model, served_name
from localradix.server.errors import APIError
from localradix.server.protocol import ErrorResponse
from localradix.server.responses import render
from localradix.server.responses.protocol import ResponsesRequest
from localradix.server.responses.request import chat_request, input_messages
from localradix.server.responses.store import ResponseStore, StoredResponse
from localradix.server.responses.stream import response_events
from localradix.server.security import caller_of
from localradix.server.tokenizer_manager import Job, TokenizerManager

NOT_KEPT = {404: ResponseSpec(ErrorResponse, description="No such response is kept"), **AUTH}
RESEND = "send the whole conversation as input instead of previous_response_id"


def _store(request: Request[Any, Any, Any]) -> ResponseStore:
    store: ResponseStore = request.app.state.setdefault("responses", ResponseStore())
    return store


def _not_found(response_id: str, why: str) -> APIError:
    return APIError(
        400,
        f"previous response '{response_id}' {why}; {RESEND}",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def _earlier(
    store: ResponseStore, response_id: str | None, owner: str | None, cache_disabled: bool
) -> StoredResponse | None:
    if response_id is None:
        return None
    if cache_disabled:
        raise _not_found(response_id, "cannot be continued: the server runs --disable-radix-cache")
    kept = store.get(response_id, owner)
    if kept is None:
        raise _not_found(response_id, "is not kept by this server")
    return kept


@post(
    "/",
    summary="Responses API: create a response (SSE when stream: true)",
    responses=ERRORS,
    status_code=200,
)
async def create_response(request: Request[Any, Any, Any]) -> Response[Any]:
    return await run_route(request, ResponsesRequest, _respond, b"{}", _in_responses_terms)


async def _respond(
    request: Request[Any, Any, Any], manager: TokenizerManager, body: ResponsesRequest
) -> Rendered:
    store, owner = _store(request), caller_of(request.scope)
    earlier = _earlier(store, body.previous_response_id, owner, manager.args.disable_radix_cache)
    conversation = [*(earlier.conversation if earlier else ()), *input_messages(body.input)]
    model = body.model or served_name(manager)
    chat = chat_request(body, model, conversation)
    served_model(manager, body.model, openai_not_found)
    job = await chat_job(manager, chat, continues=earlier.token_ids if earlier else ())
    fields = render.echo(body, model)
    keep = partial(_keep, store, owner, job, conversation) if body.store else _forget
    if earlier is not None and chat.stream:  # an evicted prefix: a 400, not a failed stream
        with closed_on_error(job):
            await job.first_output()
    events = partial(response_events, job, fields, keep) if chat.stream else None
    return Rendered(job, events, partial(_whole, fields=fields, keep=keep))


def _in_responses_terms(exc: APIError, body: ResponsesRequest) -> APIError:
    """An evicted prefix of previous_response_id (the engine's PREFIX_EVICTED) in Responses'
    terms; any other error already names Responses' field."""
    if exc.code == ErrorCode.PREFIX_EVICTED.value and body.previous_response_id:
        return _not_found(body.previous_response_id, "is no longer in the radix cache")
    return exc


def _whole(gathered: Gathered, fields: dict[str, Any], keep: Any) -> dict[str, Any]:
    job, finish = gathered.job, gathered.finish[0]
    items = render.output_items(job, output_spec(job).parse(gathered.text[0]), finish)
    body = render.finished(job, fields, items, finish)
    keep(body)
    return body


def _keep(
    store: ResponseStore,
    owner: str | None,
    job: Job,
    conversation: Sequence[dict[str, Any]],
    body: dict[str, Any],
) -> None:
    """Keep a finished response for previous_response_id: the conversation with its output as
    the assistant's turn, and the prompt+output ids the radix cache now holds."""
    ids = [*job.prompts[0], *job.choices[0].token_ids]
    store.put(body, [*conversation, render.assistant_turn(body["output"])], ids, owner)


def _forget(body: dict[str, Any]) -> None:
    """store: false."""


@get("/{response_id:str}", summary="Responses API: a kept response", responses=NOT_KEPT)
async def retrieve_response(request: Request[Any, Any, Any]) -> Response[Any]:
    response_id = request.path_params["response_id"]
    kept = _store(request).get(response_id, caller_of(request.scope))
    if kept is None:
        raise APIError(404, f"no response '{response_id}' is kept here", param="response_id")
    return json_response(kept.body)


@delete(
    "/{response_id:str}",
    summary="Responses API: forget a kept response",
    responses=NOT_KEPT,
    status_code=200,
)
async def delete_response(request: Request[Any, Any, Any]) -> Response[Any]:
    response_id = request.path_params["response_id"]
    if not _store(request).pop(response_id, caller_of(request.scope)):
        raise APIError(404, f"no response '{response_id}' is kept here", param="response_id")
    return json_response({"id": response_id, "object": "response.deleted", "deleted": True})


@route("/{response_id:str}", http_method=HttpMethod.OPTIONS, include_in_schema=False)
async def kept_response_options() -> Response[None]:
    """Litestar's own OPTIONS answer for a path lists only the methods registered there before
    it was made (GET), not DELETE."""
    return Response(None, status_code=204, headers={"Allow": "DELETE, GET, OPTIONS"})


ROUTES: list[ControllerRouterHandler] = [
    Router(
        "/responses",
        # the OPTIONS handler first, or Litestar adds its own
        route_handlers=[create_response, kept_response_options, retrieve_response, delete_response],
    )
]
