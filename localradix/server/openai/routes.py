"""The OpenAI routes under /v1: chat and text completions (JSON or SSE), embeddings
(openai/embeddings.py) and the model list (in Anthropic's shape for Anthropic's clients, who ask
the same path)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from typing import Any

from litestar import Request, Response, get, post
from litestar.openapi import ResponseSpec

from localradix.server.anthropic.render import error_body as anthropic_error
from localradix.server.anthropic.render import model_info
from localradix.server.anthropic.routes import model_list as anthropic_model_list
from localradix.server.anthropic.routes import speaks_anthropic
from localradix.server.core.docs import AUTH, ERRORS, UNAVAILABLE, UNKNOWN_MODEL
from localradix.server.core.http import closed_on_error, error_handler, json_response, state
from localradix.server.core.jobs import chat_job, completion_job
from localradix.server.core.route import Rendered, run_route
from localradix.server.core.served import served_name
from localradix.server.errors import APIError
from localradix.server.model_list import Listed, listed_models
from localradix.server.openai.chat import chat_response, chat_stream
from localradix.server.openai.completion import completion_response, completion_stream
from localradix.server.openai.embeddings import REQUEST_BODIES as EMBEDDING_BODIES
from localradix.server.openai.embeddings import embeddings
from localradix.server.openai.request import chat_request
from localradix.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from localradix.server.tokenizer_manager import TokenizerManager

# Their bodies are decoded by the routes themselves; app.py publishes these in the schema.
REQUEST_BODIES: dict[str, type] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    **EMBEDDING_BODIES,
}


@post(
    "/chat/completions",
    summary="Create a chat completion",
    responses={
        200: ResponseSpec(ChatCompletionResponse, description="The completion (or SSE)"),
        **ERRORS,
    },
    status_code=200,
)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    return await run_route(request, ChatCompletionRequest, _chat)


async def _chat(
    request: Request[Any, Any, Any], manager: TokenizerManager, req: ChatCompletionRequest
) -> Rendered:
    chat = chat_request(manager, req)
    job = await chat_job(manager, chat)
    model = served_name(manager)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    stream = partial(chat_stream, job, model, req.logprobs, include_usage) if chat.stream else None
    return Rendered(job, stream, partial(chat_response, model=model, want_logprobs=req.logprobs))


@post(
    "/completions",
    summary="Create a text completion",
    responses={
        200: ResponseSpec(CompletionResponse, description="The completion (or SSE)"),
        **ERRORS,
    },
    status_code=200,
)
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    return await run_route(request, CompletionRequest, _completion)


async def _completion(
    request: Request[Any, Any, Any], manager: TokenizerManager, req: CompletionRequest
) -> Rendered:
    job = await completion_job(manager, req)
    model = served_name(manager)
    with closed_on_error(job):
        echoed = _echoed(manager, req, job.prompts) if req.echo else []
    stream = partial(completion_stream, job, model, req, echoed) if req.stream else None
    return Rendered(
        job, stream, partial(completion_response, model=model, req=req, prompt_texts=echoed)
    )


def _echoed(
    manager: TokenizerManager, req: CompletionRequest, prompts: Sequence[Sequence[int]]
) -> list[str]:
    """The prompts as the client sent them: text as given (without the BOS the model's rule
    added), token ids (and a FIM prompt, built of ids) decoded."""
    if not req.suffix and isinstance(req.prompt, str):
        return [req.prompt]
    if not req.suffix and all(isinstance(p, str) for p in req.prompt):
        return [str(p) for p in req.prompt]
    return [manager.tokenizer.decode(p, skip_special_tokens=False) for p in prompts]


def _models_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """The model routes' errors in the asking client's dialect."""
    render = anthropic_error if speaks_anthropic(request) else APIError.body
    return error_handler(render)(request, exc)


@get(
    "/models",
    summary="List the models: the loaded ones, then every other one in the store (Anthropic's "
    "page of models for a request with an anthropic-version header)",
    responses={200: ResponseSpec(ModelList), **AUTH, **UNAVAILABLE},
    exception_handlers={Exception: _models_error},
)
async def list_models(request: Request[Any, Any, Any]) -> Response[Any]:
    listed, created = await _listed(request)
    if speaks_anthropic(request):
        infos = [model_info(m.name, m.context_length, created) for m in listed]
        return json_response(anthropic_model_list(request, infos))
    return json_response(ModelList(data=[_card(m, created) for m in listed]))


@get(
    "/models/{model_id:path}",
    summary="Describe a model (as Anthropic's ModelInfo for a request with anthropic-version)",
    responses={200: ResponseSpec(ModelCard), **AUTH, **UNKNOWN_MODEL, **UNAVAILABLE},
    exception_handlers={Exception: _models_error},
)
async def get_model(request: Request[Any, Any, Any]) -> Response[Any]:
    wanted = str(request.path_params["model_id"]).lstrip("/")
    listed, created = await _listed(request)
    found = next((m for m in listed if m.name == wanted), None)
    if found is None:
        raise APIError(
            404,
            f"the model '{wanted}' does not exist",
            param="model",
            code="model_not_found",
            type="invalid_request_error",
        )
    if speaks_anthropic(request):
        return json_response(model_info(found.name, found.context_length, created))
    return json_response(_card(found, created))


async def _listed(request: Request[Any, Any, Any]) -> tuple[list[Listed], float]:
    """The models to list, and when the server started (their `created`)."""
    server = state(request)
    server.ready_manager()
    listed = await asyncio.to_thread(listed_models, server.pool, server.args.context_length)
    return listed, server.started


def _card(model: Listed, created: float) -> ModelCard:
    return ModelCard(
        id=model.name, created=int(created), root=model.path, max_model_len=model.context_length
    )


ROUTES = [chat_completions, completions, embeddings, list_models, get_model]
