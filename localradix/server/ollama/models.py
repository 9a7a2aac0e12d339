"""The Ollama routes that describe the served model: `GET /` and `HEAD /` (liveness),
`/api/version`, `/api/tags`, `/api/ps` and `/api/show`."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

from litestar import MediaType, Request, Response, get, head, post

from localradix.server.core.body import decode
from localradix.server.core.fim import fim_tokens
from localradix.server.core.http import json_response, state
from localradix.server.model_facts import ModelFacts, model_facts
from localradix.server.ollama.protocol import ModelBody
from localradix.server.ollama.render import now_iso
from localradix.server.ollama.request import served
from localradix.server.tokenizer_manager import TokenizerManager

# The Ollama release whose API this matches; clients compare it as dotted ints (VS Code
# Copilot needs >= 0.6.4).
OLLAMA_VERSION = "0.12.0"
RUNNING = "Ollama is running"
NEVER_EXPIRES = timedelta(days=3650)  # the model stays loaded while the server runs


@get("/", media_type=MediaType.TEXT, summary="Ollama's liveness answer", include_in_schema=False)
async def root() -> str:
    return RUNNING


@head("/", media_type=MediaType.TEXT, include_in_schema=False)
async def root_head() -> None:
    return None


@get("/version", summary="Ollama: the API version")
async def version() -> Response[Any]:
    return json_response({"version": OLLAMA_VERSION})


async def _facts(request: Request[Any, Any, Any]) -> tuple[TokenizerManager, ModelFacts]:
    manager = state(request).ready_manager()
    info = manager.client.loaded
    facts = await asyncio.to_thread(
        model_facts, info.name, info.path, info.context_length, info.architecture
    )
    return manager, facts


def _listing(facts: ModelFacts) -> dict[str, Any]:
    return {
        "name": facts.name,
        "model": facts.name,
        "modified_at": now_iso(facts.modified or None),
        "size": facts.size,
        "digest": facts.digest,
        "details": facts.details(),
    }


@get("/tags", summary="Ollama: the models available (the one served)")
async def tags(request: Request[Any, Any, Any]) -> Response[Any]:
    _, facts = await _facts(request)
    return json_response({"models": [_listing(facts)]})


@get("/ps", summary="Ollama: the models loaded (the one served)")
async def ps(request: Request[Any, Any, Any]) -> Response[Any]:
    manager, facts = await _facts(request)
    on_gpu = manager.client.loaded.device not in ("cpu", "")
    expires = now_iso(time.time() + NEVER_EXPIRES.total_seconds())
    loaded = {
        **_listing(facts),
        "expires_at": expires,
        "size_vram": facts.size if on_gpu else 0,
        "context_length": manager.context_length,
    }
    return json_response({"models": [loaded]})


@post("/show", summary="Ollama: describe a model", status_code=200)
async def show(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body() or b"{}", ModelBody)
    manager, facts = await _facts(request)
    served(manager, body.model or body.name)
    template = getattr(manager.tokenizer, "chat_template", None) or ""
    return json_response(
        {
            "license": facts.license,
            "modelfile": f"# served by localradix\nFROM {manager.client.loaded.path}\n",
            "parameters": f"num_ctx                        {manager.context_length}",
            "template": template,
            "details": facts.details(),
            "model_info": facts.model_info,
            "capabilities": _capabilities(manager),
            "modified_at": now_iso(facts.modified or None),
        }
    )


def _capabilities(manager: TokenizerManager) -> list[str]:
    if manager.client.loaded.pooling is not None:
        return ["embedding"]  # what Ollama lists for an embedding model
    capabilities = ["completion"]
    if manager.tool_parser is not None:
        capabilities.append("tools")
    if fim_tokens(manager.tokenizer) is not None:
        capabilities.append("insert")
    if manager.reasoning_parser is not None:
        capabilities.append("thinking")
    return capabilities


ROOT_ROUTES = [root, root_head]
API_ROUTES = [version, tags, ps, show]  # under /api
