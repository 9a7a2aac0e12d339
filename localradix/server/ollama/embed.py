"""Ollama's embeddings: `/api/embed` (`input` one string or several; `truncate`, on by default,
cuts inputs to the context instead of refusing them; `dimensions`) and the legacy
`/api/embeddings` (`prompt` -> `embedding`). A generation model gets a 400 saying it cannot
embed."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from msgspec import Struct

from localradix.server.core.body import decode
from localradix.server.core.docs import OLLAMA_ERRORS
from localradix.server.core.embeddings import embed, input_ids, model_embed, shortened
from localradix.server.core.http import client_gone_response, json_response, state
from localradix.server.ollama.request import served


class EmbedBody(Struct, kw_only=True):
    model: str = ""
    input: str | list[str] = ""
    truncate: bool = True
    dimensions: int | None = None
    options: dict[str, Any] | None = None  # accepted; nothing in them changes a vector
    keep_alive: float | str | None = None


class EmbeddingsBody(Struct, kw_only=True):
    model: str = ""
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None


@post(
    "/embed",
    summary="Ollama: embed one input or several",
    status_code=200,
    responses=OLLAMA_ERRORS,
)
async def embed_inputs(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body() or b"{}", EmbedBody)
    manager = await state(request).manager_for(request, body.model, body.keep_alive)
    model = served(manager, body.model)
    how = model_embed(manager)
    inputs = [body.input] if isinstance(body.input, str) else body.input
    if not any(inputs):  # Ollama: nothing to embed only loads the model
        return json_response({"model": model, "embeddings": []})
    prompts = await input_ids(manager, inputs, "input", body.truncate)
    done = await embed(request, manager, prompts, how)
    if done is None:
        return client_gone_response()
    return json_response(
        {
            "model": model,
            "embeddings": [shortened(v, body.dimensions) for v in done.vectors],
            "total_duration": int(done.seconds * 1e9),
            "load_duration": 0,
            "prompt_eval_count": done.prompt_tokens,
        }
    )


@post(
    "/embeddings",
    summary="Ollama: embed one prompt (the older route)",
    status_code=200,
    responses=OLLAMA_ERRORS,
)
async def embed_prompt(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body() or b"{}", EmbeddingsBody)
    manager = await state(request).manager_for(request, body.model, body.keep_alive)
    served(manager, body.model)
    how = model_embed(manager)
    if not body.prompt:  # Ollama answers an empty prompt with an empty vector
        return json_response({"embedding": []})
    prompts = await input_ids(manager, [body.prompt], "prompt", truncate=True)
    done = await embed(request, manager, prompts, how)
    if done is None:
        return client_gone_response()
    return json_response({"embedding": done.vectors[0]})


ROUTES = [embed_inputs, embed_prompt]
