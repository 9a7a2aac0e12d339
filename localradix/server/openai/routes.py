"""The OpenAI routes under /v1: chat and text completions (JSON or SSE), embeddings
(openai/embeddings.py) and the model list."""

from __future__ import annotations

from functools import partial
from typing import Any

from litestar import Request, Response, get, post
from litestar.openapi import ResponseSpec

from localradix.server.core.body import decode
from localradix.server.core.docs import AUTH, ERRORS, UNAVAILABLE, UNKNOWN_MODEL
from localradix.server.core.gather import answer
from localradix.server.core.http import closed_on_error, json_response, state
from localradix.server.core.jobs import chat_job, completion_job, served_name
from localradix.server.errors import APIError
from localradix.server.openai.chat import chat_response, chat_stream
from localradix.server.openai.completion import completion_response, completion_stream
from localradix.server.openai.embeddings import REQUEST_BODIES as EMBEDDING_BODIES
from localradix.server.openai.embeddings import embeddings
from localradix.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)

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
    req = decode(await request.body(), ChatCompletionRequest)
    manager = state(request).ready_manager()
    job = await chat_job(manager, req)
    model = served_name(manager)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    stream = partial(chat_stream, job, model, req.logprobs, include_usage) if req.stream else None
    whole = partial(chat_response, model=model, want_logprobs=req.logprobs)
    return await answer(request, job, stream, whole)


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
    req = decode(await request.body(), CompletionRequest)
    manager = state(request).ready_manager()
    job = await completion_job(manager, req)
    model = served_name(manager)
    with closed_on_error(job):
        decode_ids = manager.tokenizer.decode
        echoed = [decode_ids(p, skip_special_tokens=False) for p in job.prompts] if req.echo else []
    stream = partial(completion_stream, job, model, req, echoed) if req.stream else None
    whole = partial(completion_response, model=model, req=req, prompt_texts=echoed)
    return await answer(request, job, stream, whole)


@get(
    "/models",
    summary="List the served model",
    responses={200: ResponseSpec(ModelList), **AUTH, **UNAVAILABLE},
)
async def list_models(request: Request[Any, Any, Any]) -> Response[Any]:
    return json_response(ModelList(data=[_model_card(request)]))


@get(
    "/models/{model_id:path}",
    summary="Describe the served model",
    responses={200: ResponseSpec(ModelCard), **AUTH, **UNKNOWN_MODEL, **UNAVAILABLE},
)
async def get_model(request: Request[Any, Any, Any], model_id: str) -> Response[Any]:
    card = _model_card(request)
    if model_id.lstrip("/") != card.id:
        raise APIError(
            404,
            f"the model '{model_id.lstrip('/')}' does not exist",
            param="model",
            code="model_not_found",
            type="invalid_request_error",
        )
    return json_response(card)


def _model_card(request: Request[Any, Any, Any]) -> ModelCard:
    server = state(request)
    server.ready_manager()
    info = server.client.loaded
    return ModelCard(
        id=info.name,
        created=int(server.started),
        root=info.path,
        max_model_len=info.context_length,
    )


ROUTES = [chat_completions, completions, embeddings, list_models, get_model]
