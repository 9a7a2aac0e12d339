"""llama.cpp's `POST /infill` (llama.vscode, llama.vim): fill-in-the-middle from
`input_prefix`, `input_suffix`, the other files `input_extra` and a `prompt` after the middle
token, laid out as llama.cpp does (see core/fim.py), answered in llama.cpp's /completion shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated, Any

from litestar import Request, Response, post
from msgspec import Meta, Struct

from localradix.server.core.body import convert
from localradix.server.core.docs import ERRORS
from localradix.server.core.fim import fim_prompt, repo_context, require_fim
from localradix.server.core.gather import Gathered, batches
from localradix.server.core.http import sse
from localradix.server.core.jobs import completion_job, encode
from localradix.server.core.route import Rendered, run_route
from localradix.server.core.served import served_name
from localradix.server.errors import APIError
from localradix.server.openai.render import usage
from localradix.server.protocol import CompletionRequest
from localradix.server.tokenizer_manager import Job, TokenizerManager

RENAMES = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty"}


class InfillFile(Struct):
    filename: str = ""
    text: str = ""


class InfillBody(Struct, kw_only=True):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: Annotated[list[InfillFile], Meta(max_length=256)] = []
    prompt: str = ""  # after the middle token: the start of the middle the user already typed
    n_predict: int | None = None  # -1: as many as fit
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    stream: bool = False
    model: str | None = None  # another model of the store (default: the one served)


@post(
    "/infill",
    summary="llama.cpp: fill in the middle (input_prefix, input_suffix)",
    status_code=200,
    responses=ERRORS,
)
async def infill(request: Request[Any, Any, Any]) -> Response[Any]:
    return await run_route(request, InfillBody, _infill, b"{}")


async def _infill(
    request: Request[Any, Any, Any], manager: TokenizerManager, body: InfillBody
) -> Rendered:
    fim = require_fim(manager.tokenizer, "input_suffix")
    files = [(f.filename, f.text) for f in body.input_extra]
    ids = fim_prompt(
        fim,
        await encode(manager, body.input_prefix),
        await encode(manager, body.input_suffix),
        context=repo_context(fim, lambda text: manager.tokenizer.encode(text, False), files),
        after_middle=await encode(manager, body.prompt) if body.prompt else [],
        lead=manager.prompt_lead,
    )
    fields = {
        "prompt": ids,
        "max_tokens": body.n_predict
        if body.n_predict is not None and body.n_predict >= 0
        else None,
        "temperature": body.temperature,
        "top_k": body.top_k,
        "top_p": body.top_p,
        "min_p": body.min_p,
        "repetition_penalty": body.repeat_penalty,
        "seed": body.seed,
        "stop": body.stop,
    }
    req = convert({k: v for k, v in fields.items() if v is not None}, CompletionRequest, RENAMES)
    job = await completion_job(manager, req)
    model = served_name(manager)
    stream = partial(_events, job, model) if body.stream else None
    return Rendered(job, stream, partial(_content, model=model))


def _content(gathered: Gathered, model: str) -> dict[str, Any]:
    """llama.cpp's /completion answer (the fields its editor plugins read)."""
    return {"content": gathered.text[0], **_final(gathered.job, model, gathered.finish[0])}


async def _events(job: Job, model: str) -> AsyncIterator[bytes]:
    """llama.cpp's stream: an SSE event per piece of text (`stop: false`), then one with
    `stop: true` and the counts; an error after the headers went out is an `error` event."""
    finish = None
    try:
        async for part in batches(job):
            if isinstance(part, APIError):
                yield sse({"error": {"code": part.status, "message": part.message}})
                return
            for d in part:
                if d.text:
                    yield sse({"content": d.text, "stop": False})
                finish = d.finish_reason or finish
        yield sse({"content": "", **_final(job, model, finish)})
    finally:
        job.close()


def _final(job: Job, model: str, finish: str | None) -> dict[str, Any]:
    counts = usage(job)
    return {
        "model": model,
        "stop": True,
        "stop_type": "limit" if finish == "length" else "eos",
        "tokens_predicted": counts.completion_tokens,
        "tokens_evaluated": counts.prompt_tokens,
        "tokens_cached": details.cached_tokens if (details := counts.prompt_tokens_details) else 0,
    }


ROUTES = [infill]
