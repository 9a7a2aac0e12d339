"""OpenAI `POST /v1/embeddings`: `input` as a string, strings, token ids or lists of them;
`encoding_format` float or base64 (little-endian float32, what the `openai` SDK asks for by
default); `dimensions` keeps the first values, renormalised (Matryoshka-style)."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from litestar import Request, Response, post
from litestar.openapi import ResponseSpec
from msgspec import Meta, Struct

from localradix.server.core.body import decode
from localradix.server.core.docs import ERRORS
from localradix.server.core.embeddings import embed, input_ids, model_embed, shortened
from localradix.server.core.http import client_gone_response, json_response, state
from localradix.server.core.served import openai_not_found, served_model, served_name
from localradix.server.errors import bad_request

Count = Annotated[int, Meta(ge=0)]


class EmbeddingRequest(Struct, kw_only=True):
    # A string, a list of strings, a list of token ids, or a list of token-id lists.
    input: (
        Annotated[str, Meta(min_length=1)]
        | Annotated[list[str | Count | list[Count]], Meta(min_length=1)]
    )
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None


class EmbeddingData(Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(Struct):
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


@post(
    "/embeddings",
    summary="Create embeddings (embedding models only)",
    responses={200: ResponseSpec(EmbeddingResponse, description="The vectors"), **ERRORS},
    status_code=200,
)
async def embeddings(request: Request[Any, Any, Any]) -> Response[Any]:
    req = decode(await request.body(), EmbeddingRequest)
    manager = await state(request).manager_for(request, req.model)
    served_model(manager, req.model, openai_not_found)
    how = model_embed(manager)
    prompts = await input_ids(manager, _inputs(req.input), "input", truncate=False)
    done = await embed(request, manager, prompts, how)
    if done is None:
        return client_gone_response()
    data = [
        EmbeddingData(i, _encoded(shortened(v, req.dimensions), req.encoding_format))
        for i, v in enumerate(done.vectors)
    ]
    usage = EmbeddingUsage(done.prompt_tokens, done.prompt_tokens)
    return json_response(EmbeddingResponse(data, served_name(manager), usage))


def _inputs(value: str | list[Any]) -> list[Any]:
    """One input per vector: a string, the strings, one token-id list or several."""
    if isinstance(value, str):
        return [value]
    if all(isinstance(v, int) for v in value):
        return [value]
    if all(isinstance(v, str) for v in value) or all(isinstance(v, list) for v in value):
        return value
    raise bad_request("'input' mixes strings, token ids and lists", "input")


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


REQUEST_BODIES: dict[str, type] = {"/v1/embeddings": EmbeddingRequest}
