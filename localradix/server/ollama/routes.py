"""The Ollama API (`/api/*` and `GET /`), which Zed, Roo Code, Cline, Continue, Copilot's Ollama
provider and Open WebUI speak, over the request core (see core/).

Requests become neutral chat requests (raw and FIM prompts: OpenAI completion requests);
outputs come back as Ollama's JSON (NDJSON lines when streaming, the default); every error is `{"error": "..."}` with a 4xx/503 status. `model` picks
one of the store's models (loaded on demand, see model_pool.py) and `keep_alive` says how long it
stays loaded once idle; `/api/pull` and `/api/delete` work on the store (see store.py).
`/api/generate` ends with `context` (the prompt's and the output's token ids; not for a raw
prompt); sent back with a templated prompt, that prompt follows those ids, which the radix cache
still holds.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from litestar import Request, Response, Router, post
from litestar.types import ControllerRouterHandler

from localradix.server.core.docs import OLLAMA_ERRORS
from localradix.server.core.http import NDJSON, error_handler, json_response
from localradix.server.core.jobs import chat_job, completion_job
from localradix.server.core.keep_alive import keep_alive_seconds
from localradix.server.core.route import Rendered, run_route
from localradix.server.errors import APIError
from localradix.server.ollama import embed, models, store
from localradix.server.ollama.protocol import ChatBody, GenerateBody
from localradix.server.ollama.render import (
    Wrap,
    chat_fields,
    generate_fields,
    ndjson,
    now_iso,
    response_body,
)
from localradix.server.ollama.request import chat_request, generate_request, served
from localradix.server.protocol import CompletionRequest
from localradix.server.tokenizer_manager import Job, TokenizerManager


def _rendered(
    job: Job, model: str, stream: bool, wrap: Wrap, think: Any, context: bool = False
) -> Rendered:
    """The job's answer, streamed or whole; `context`: end with generate's `context`."""
    lines = partial(ndjson, job, model, wrap, think, context) if stream else None
    whole = partial(response_body, job, model, wrap=wrap, think=think, context=context)
    return Rendered(job, lines, whole, NDJSON)


def _loaded(model: str, keep_alive: float | str | None, fields: dict[str, Any]) -> Response[Any]:
    """An empty prompt only (un)loads the model: it was loaded to get here, and keep_alive 0
    unloads it once this answer is sent (never the default or a pinned model)."""
    unload = keep_alive_seconds(keep_alive) == 0
    body = {"model": model, "created_at": now_iso(), **fields, "done": True}
    return json_response({**body, "done_reason": "unload" if unload else "load"})


@post(
    "/chat",
    summary="Ollama: chat (NDJSON stream unless stream: false)",
    status_code=200,
    responses=OLLAMA_ERRORS,
)
async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
    return await run_route(request, ChatBody, _chat, b"{}")


async def _chat(
    request: Request[Any, Any, Any], manager: TokenizerManager, body: ChatBody
) -> Rendered | Response[Any]:
    if not body.messages:
        model = served(manager, body.model)
        empty = {"message": {"role": "assistant", "content": ""}}
        return _loaded(model, body.keep_alive, empty)
    chat = chat_request(manager, body)
    job = await chat_job(manager, chat)
    return _rendered(job, str(chat.model), chat.stream, chat_fields, body.think)


@post(
    "/generate",
    summary="Ollama: complete a prompt (NDJSON unless stream: false)",
    status_code=200,
    responses=OLLAMA_ERRORS,
)
async def generate(request: Request[Any, Any, Any]) -> Response[Any]:
    return await run_route(request, GenerateBody, _generate, b"{}")


async def _generate(
    request: Request[Any, Any, Any], manager: TokenizerManager, body: GenerateBody
) -> Rendered | Response[Any]:
    if not body.prompt and not body.suffix:
        model = served(manager, body.model)
        return _loaded(model, body.keep_alive, {"response": ""})
    req = generate_request(manager, body)
    if isinstance(req, CompletionRequest):
        job = await completion_job(manager, req)
    else:
        job = await chat_job(manager, req, context=body.context or ())
    # Ollama's `context` ends every answer but a raw prompt's (a FIM one's too).
    context = not body.raw
    return _rendered(job, str(req.model), body.stream, generate_fields, body.think, context)


def ollama_error(err: APIError) -> dict[str, Any]:
    return {"error": err.message}


_api = Router(
    "/api",
    route_handlers=[*models.API_ROUTES, chat, generate, *embed.ROUTES, *store.ROUTES],
    exception_handlers={Exception: error_handler(ollama_error)},
)
ROUTES: list[ControllerRouterHandler] = [*models.ROOT_ROUTES, _api]
