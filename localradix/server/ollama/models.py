"""The Ollama routes that describe the models: `GET /` and `HEAD /` (liveness),
`/api/version`, `/api/tags`, `/api/ps` and `/api/show`."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from litestar import MediaType, Request, Response, get, head, post

from localradix.server.core.body import decode
from localradix.server.core.docs import OllamaError, errors
from localradix.server.core.fim import fim_tokens
from localradix.server.core.http import json_response, state
from localradix.server.model_facts import ModelFacts, model_facts
from localradix.server.model_list import listed_models
from localradix.server.ollama.protocol import ModelBody
from localradix.server.ollama.render import now_iso
from localradix.server.ollama.request import served
from localradix.server.resident import State
from localradix.server.tokenizer_manager import TokenizerManager

if TYPE_CHECKING:
    from localradix.server.state import ServerState

# The Ollama release whose API this matches; clients compare it as dotted ints (VS Code
# Copilot needs >= 0.6.4).
OLLAMA_VERSION = "0.12.0"
RUNNING = "Ollama is running"
_AUTH = errors(OllamaError, (401,))
_AVAILABLE = errors(OllamaError, (401, 503))
_SHOW = errors(OllamaError, (400, 401, 404, 413, 503))
NEVER_EXPIRES = timedelta(days=3650)  # a pinned (or the default) model stays loaded


@get("/", media_type=MediaType.TEXT, summary="Ollama's liveness answer", include_in_schema=False)
async def root() -> str:
    return RUNNING


@head("/", media_type=MediaType.TEXT, include_in_schema=False)
async def root_head() -> None:
    return None


@get("/version", summary="Ollama: the API version", responses=_AUTH)
async def version() -> Response[Any]:
    return json_response({"version": OLLAMA_VERSION})


async def _facts(manager: TokenizerManager) -> ModelFacts:
    info = manager.client.loaded
    return await asyncio.to_thread(
        model_facts, info.name, info.path, info.context_length, info.architecture
    )


def _listing(facts: ModelFacts) -> dict[str, Any]:
    return {
        "name": facts.name,
        "model": facts.name,
        "modified_at": now_iso(facts.modified or None),
        "size": facts.size,
        "digest": facts.digest,
        "details": facts.details(),
    }


def _all_facts(server: ServerState) -> list[ModelFacts]:
    """Every model the server can answer for (reads the store and headers: in a thread)."""
    listed = listed_models(server.pool, server.args.context_length)
    return [model_facts(m.name, m.path, m.context_length, m.architecture) for m in listed]


@get(
    "/tags",
    summary="Ollama: the models available (loaded, then the rest of the store)",
    responses=_AVAILABLE,
)
async def tags(request: Request[Any, Any, Any]) -> Response[Any]:
    server = state(request)
    server.ready_manager()
    facts = await asyncio.to_thread(_all_facts, server)
    return json_response({"models": [_listing(f) for f in facts]})


@get("/ps", summary="Ollama: the models loaded, with memory and expiry", responses=_AVAILABLE)
async def ps(request: Request[Any, Any, Any]) -> Response[Any]:
    server = state(request)
    server.ready_manager()
    models = []
    for resident in server.pool.residents:
        manager = resident.manager
        if resident.state != State.READY or manager is None:
            continue
        facts = await _facts(manager)
        on_gpu = manager.client.loaded.device not in ("cpu", "")
        expires = resident.expires_at or time.time() + NEVER_EXPIRES.total_seconds()
        size = resident.memory or facts.size
        loaded = {
            **_listing(facts),
            "expires_at": now_iso(expires),
            "size": size,
            "size_vram": size if on_gpu else 0,
            "context_length": manager.context_length,
        }
        models.append(loaded)
    return json_response({"models": models})


@post("/show", summary="Ollama: describe a model", status_code=200, responses=_SHOW)
async def show(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body() or b"{}", ModelBody)
    manager = await state(request).manager_for(request, body.model or body.name or None)
    facts = await _facts(manager)
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
    # Only where the model sees the tools: its template writes them, or the server does.
    if manager.tool_parser is not None and (manager.injects_tools or manager.tool_prompt.native):
        capabilities.append("tools")
    if fim_tokens(manager.tokenizer) is not None:
        capabilities.append("insert")
    if manager.reasoning_parser is not None:
        capabilities.append("thinking")
    return capabilities


ROOT_ROUTES = [root, root_head]
API_ROUTES = [version, tags, ps, show]  # under /api
