"""The Ollama API (`/api/*` and `GET /`), which Zed, Roo Code, Cline, Continue, Copilot's Ollama
provider and Open WebUI speak, over the OpenAI routes' request core (see dialect.py).

Requests become OpenAI requests; outputs come back as Ollama's JSON (NDJSON lines when
streaming, the default); every error is `{"error": "..."}` with a 4xx status. The model is always
loaded: `keep_alive` is accepted (and validated) but unloads nothing; `/api/pull` and friends
answer 501 (there is no model store).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from litestar import MediaType, Request, Response, Router, delete, get, head, post
from litestar.types import ControllerRouterHandler
from msgspec import Struct

from localradix.parsers.events import ContentDelta, ToolCall, ToolCallDelta
from localradix.parsers.output_parser import ReasoningContentDelta
from localradix.server import serving
from localradix.server.dialect import (
    ClosingStream,
    Timing,
    batches,
    check_model,
    constraint_compiled,
    convert,
    decode,
    encode_json,
    error_handler,
    gather,
    json_response,
    state,
)
from localradix.server.errors import APIError, bad_request
from localradix.server.model_facts import ModelFacts, model_facts
from localradix.server.protocol import ChatCompletionRequest, CompletionRequest
from localradix.server.tokenizer_manager import Job, TokenizerManager

# The Ollama release whose API this matches; clients compare it as dotted ints (VS Code
# Copilot needs >= 0.6.4).
OLLAMA_VERSION = "0.12.0"
RUNNING = "Ollama is running"
NDJSON = "application/x-ndjson"
NEVER_EXPIRES = timedelta(days=3650)  # the model stays loaded while the server runs
# OpenAI field -> the Ollama option it came from (for error messages).
RENAMES = {
    "max_tokens": "num_predict",
    "repetition_penalty": "repeat_penalty",
    "response_format": "format",
}
_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


# ---- request bodies (unknown keys ignored, types strict) -------------------------------------


class Options(Struct, kw_only=True):
    num_ctx: int | None = None
    num_predict: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class ToolFunction(Struct):
    name: str
    arguments: dict[str, Any] | str = {}


class ToolCallIn(Struct):
    function: ToolFunction
    id: str | None = None


class Message(Struct, kw_only=True):
    role: str
    content: str = ""
    images: list[Any] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None
    thinking: str | None = None


class _Request(Struct, kw_only=True):
    model: str = ""
    stream: bool = True
    format: str | dict[str, Any] | None = None
    options: Options | None = None
    keep_alive: float | str | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    images: list[Any] | None = None


class ChatBody(_Request, kw_only=True):
    messages: list[Message] = []
    tools: list[dict[str, Any]] | None = None


class GenerateBody(_Request, kw_only=True):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False


class ModelBody(Struct, kw_only=True):
    model: str = ""
    name: str = ""  # the older spelling


# ---- request -> OpenAI request ---------------------------------------------------------------


def _served(manager: TokenizerManager, model: str) -> str:
    if not model:
        raise bad_request("model is required", "model")
    return check_model(manager, model, latest_ok=True)


def keep_alive_seconds(value: float | str | None) -> float | None:
    """Ollama's keep_alive: seconds, or a Go duration ("5m", "1h30m", "-1"); None: default."""
    if value is None or isinstance(value, (int, float)):
        return value
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise bad_request(f"keep_alive: invalid duration {value!r} (try 300, '5m' or -1)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _sampling(opts: Options | None, fmt: str | dict[str, Any] | None) -> dict[str, Any]:
    """Ollama options as OpenAI sampling fields (None leaves the core's default)."""
    fields: dict[str, Any] = {"max_tokens": None, "response_format": _format(fmt)}
    if opts is None:
        return fields
    if opts.num_predict is not None and opts.num_predict >= 0:
        fields["max_tokens"] = opts.num_predict
    elif opts.num_predict not in (None, -1, -2):  # -1: no limit, -2: fill the context
        raise bad_request("num_predict must be >= 0, -1 (no limit) or -2 (fill the context)")
    top_k = opts.top_k
    if top_k is not None and top_k <= 0:  # Ollama: 0 disables top-k
        top_k = -1
    fields.update(
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=top_k,
        min_p=opts.min_p,
        stop=opts.stop or None,
        seed=opts.seed,
        repetition_penalty=opts.repeat_penalty,
        presence_penalty=opts.presence_penalty,
        frequency_penalty=opts.frequency_penalty,
    )
    # num_ctx: the context is fixed when the model loads; a prompt longer than it is a 400.
    return fields


def _format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise bad_request(f'invalid format {fmt!r}: give "json" or a JSON schema object', "format")


def _check_common(manager: TokenizerManager, body: _Request, model: str) -> None:
    keep_alive_seconds(body.keep_alive)
    if body.images:
        raise bad_request("images are not supported: this model reads text only", "images")
    if body.logprobs:
        raise bad_request("logprobs are not supported on the Ollama API", "logprobs")
    if body.think not in (None, False) and manager.reasoning_parser is None:
        raise bad_request(f'"{model}" does not support thinking', "think")


def _message(msg: Message, i: int) -> dict[str, Any]:
    if msg.images:
        raise bad_request("images are not supported: this model reads text only", "images")
    out: dict[str, Any] = {"role": msg.role, "content": msg.content}
    if msg.thinking:
        out["reasoning_content"] = msg.thinking
    if msg.tool_name:
        out["name"] = msg.tool_name
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id or f"call_{i}_{j}",
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for j, call in enumerate(msg.tool_calls)
        ]
    return out


def chat_request(manager: TokenizerManager, body: ChatBody) -> ChatCompletionRequest:
    model = _served(manager, body.model)
    _check_common(manager, body, model)
    fields = _sampling(body.options, body.format)
    fields.update(
        model=model,
        messages=[_message(m, i) for i, m in enumerate(body.messages)],
        tools=body.tools or None,
    )
    return convert(
        {k: v for k, v in fields.items() if v is not None}, ChatCompletionRequest, RENAMES
    )


def generate_request(
    manager: TokenizerManager, body: GenerateBody
) -> ChatCompletionRequest | CompletionRequest:
    """`raw` prompts go to the completion core as they are; others through the chat template."""
    model = _served(manager, body.model)
    _check_common(manager, body, model)
    if body.suffix:
        raise bad_request("'suffix' (fill-in-the-middle) is not supported yet", "suffix")
    if body.template:
        raise bad_request(
            "a custom 'template' is not supported: the model's own chat template is used "
            "(send raw: true to send a prompt as it is)",
            "template",
        )
    if body.context:
        raise bad_request("'context' is not supported: send the conversation to /api/chat")
    fields = _sampling(body.options, body.format)
    fields["model"] = model
    if body.raw:
        fields["prompt"] = body.prompt
        cleaned = {k: v for k, v in fields.items() if v is not None or k == "max_tokens"}
        return convert(cleaned, CompletionRequest, RENAMES)
    messages = [{"role": "system", "content": body.system}] if body.system else []
    fields["messages"] = [*messages, {"role": "user", "content": body.prompt}]
    return convert(
        {k: v for k, v in fields.items() if v is not None}, ChatCompletionRequest, RENAMES
    )


# ---- outputs -> Ollama bodies ----------------------------------------------------------------


def now_iso(at: float | None = None) -> str:
    when = datetime.fromtimestamp(time.time() if at is None else at, timezone.utc)
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def _final(job: Job, model: str, timing: Timing, finish: str | None) -> dict[str, Any]:
    """The `done: true` fields: reason, counts and durations (ns)."""
    usage = job.usage()
    end = timing.end or time.monotonic()
    first = timing.first or end
    return {
        "model": model,
        "created_at": now_iso(),
        "done": True,
        "done_reason": "length" if finish == "length" else "stop",
        "total_duration": _ns(end - timing.start),
        "load_duration": 0,
        "prompt_eval_count": usage["prompt_tokens"],
        "prompt_eval_duration": _ns(first - timing.start),
        "eval_count": usage["completion_tokens"],
        "eval_duration": _ns(end - first),
    }


def _arguments(call: ToolCall) -> dict[str, Any]:
    """Ollama sends a call's arguments as a JSON object, not as JSON text."""
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "function": {"index": i, "name": c.name, "arguments": _arguments(c)}}
        for i, c in enumerate(calls)
    ]


Wrap = Callable[[str, str | None, list[ToolCall]], dict[str, Any]]


def chat_fields(content: str, thinking: str | None, calls: list[ToolCall]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = _tool_calls(calls)
    return {"message": message}


def generate_fields(content: str, thinking: str | None, calls: list[ToolCall]) -> dict[str, Any]:
    return {"response": content, **({"thinking": thinking} if thinking else {})}


def response_body(job: Job, model: str, gathered: Any, wrap: Wrap, think: Any) -> dict[str, Any]:
    spec = job.output or serving.PLAIN_OUTPUT
    parsed = spec.parse(gathered.text[0])
    thinking = parsed.reasoning if think is not False else None
    final = _final(job, model, gathered.timing, gathered.finish[0])
    return {**final, **wrap(parsed.content, thinking, parsed.calls)}


def _line(payload: dict[str, Any]) -> bytes:
    return encode_json(payload) + b"\n"


async def ndjson(job: Job, model: str, wrap: Wrap, think: Any) -> AsyncIterator[bytes]:
    """NDJSON lines: text as it comes, tool calls whole once parsed, then the `done` line."""
    parser = (job.output or serving.PLAIN_OUTPUT).stream_parser()
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
    timing = Timing(job)
    finish: str | None = None
    try:
        async for part in batches(job, timing):
            if isinstance(part, APIError):
                yield _line({"error": part.message})
                return
            for d in part:
                events = parser.feed(d.text) if d.text else []
                if d.finish_reason:
                    finish = d.finish_reason
                    events += parser.finish()
                content, thinking = "", ""
                for event in events:
                    if isinstance(event, ContentDelta):
                        content += event.text
                    elif isinstance(event, ReasoningContentDelta):
                        thinking += event.text
                    elif isinstance(event, ToolCallDelta):
                        call = calls.setdefault(event.index, [event.id or "", event.name or "", ""])
                        call[2] += event.arguments
                if think is False:
                    thinking = ""
                if content or thinking:
                    head = {"model": model, "created_at": now_iso(), "done": False}
                    yield _line({**head, **wrap(content, thinking or None, [])})
        if calls:
            whole = [ToolCall(*calls[i]) for i in sorted(calls)]
            head = {"model": model, "created_at": now_iso(), "done": False}
            yield _line({**head, **wrap("", None, whole)})
        yield _line({**_final(job, model, timing, finish), **wrap("", None, [])})
    finally:
        job.close()


async def _answer(
    request: Request[Any, Any, Any], job: Job, model: str, stream: bool, wrap: Wrap, think: Any
) -> Response[Any]:
    try:
        if stream:
            await constraint_compiled(job)
            return ClosingStream(ndjson(job, model, wrap, think), NDJSON)
        gathered = await gather(request, job)
    except BaseException:
        job.close()
        raise
    if gathered is None:
        return Response(b"", status_code=499)
    return json_response(response_body(job, model, gathered, wrap, think))


def _loaded(model: str, keep_alive: float | str | None, fields: dict[str, Any]) -> Response[Any]:
    """An empty prompt only (un)loads the model in Ollama; here it is always loaded."""
    unload = keep_alive_seconds(keep_alive) == 0
    body = {"model": model, "created_at": now_iso(), **fields, "done": True}
    return json_response({**body, "done_reason": "unload" if unload else "load"})


# ---- routes ----------------------------------------------------------------------------------


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
    info = manager.client.info
    facts = await asyncio.to_thread(
        model_facts,
        str(info["name"]),
        str(info.get("path", "")),
        int(info["context_length"]),
        str(info.get("architecture", "")),
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
    info = manager.client.info
    on_gpu = str(info.get("device", "cpu")) not in ("cpu", "")
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
    body = decode(await request.body(), ModelBody)
    manager, facts = await _facts(request)
    _served(manager, body.model or body.name)
    capabilities = ["completion"]
    if manager.tool_parser is not None:
        capabilities.append("tools")
    if manager.reasoning_parser is not None:
        capabilities.append("thinking")
    template = getattr(manager.tokenizer, "chat_template", None) or ""
    return json_response(
        {
            "license": facts.license,
            "modelfile": f"# served by localradix\nFROM {manager.client.info.get('path', '')}\n",
            "parameters": f"num_ctx                        {manager.context_length}",
            "template": template,
            "details": facts.details(),
            "model_info": facts.model_info,
            "capabilities": capabilities,
            "modified_at": now_iso(facts.modified or None),
        }
    )


@post("/chat", summary="Ollama: chat (NDJSON stream unless stream: false)", status_code=200)
async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body(), ChatBody)
    manager = state(request).ready_manager()
    if not body.messages:
        model = _served(manager, body.model)
        empty = {"message": {"role": "assistant", "content": ""}}
        return _loaded(model, body.keep_alive, empty)
    req = chat_request(manager, body)
    job = await serving.chat_job(manager, req)
    return await _answer(request, job, str(req.model), body.stream, chat_fields, body.think)


@post(
    "/generate", summary="Ollama: complete a prompt (NDJSON unless stream: false)", status_code=200
)
async def generate(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body(), GenerateBody)
    manager = state(request).ready_manager()
    if not body.prompt and not body.suffix:
        model = _served(manager, body.model)
        return _loaded(model, body.keep_alive, {"response": ""})
    req = generate_request(manager, body)
    if isinstance(req, CompletionRequest):
        job = await serving.completion_job(manager, req)
    else:
        job = await serving.chat_job(manager, req)
    return await _answer(request, job, str(req.model), body.stream, generate_fields, body.think)


@post(["/embed", "/embeddings"], summary="Ollama: embeddings (not for this model)", status_code=200)
async def embed(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body(), ModelBody)
    manager = state(request).ready_manager()
    model = _served(manager, body.model or body.name)
    raise bad_request(
        f'"{model}" does not support embeddings: it is a text generation model, and localradix '
        "does not serve embedding models yet"
    )


def _no_model_store() -> APIError:
    return APIError(
        501,
        "localradix serves the one model it was started with and has no model store: start "
        "`localradix serve MODEL` with another model instead",
    )


# Not in the OpenAPI schema: they only ever answer 501 (no model store).
@post(["/pull", "/push", "/create", "/copy"], status_code=200, include_in_schema=False)
async def model_store(request: Request[Any, Any, Any]) -> Response[Any]:
    raise _no_model_store()


@delete("/delete", status_code=200, include_in_schema=False)
async def delete_model(request: Request[Any, Any, Any]) -> Response[Any]:
    raise _no_model_store()


def ollama_error(err: APIError) -> dict[str, Any]:
    return {"error": err.message}


_api = Router(
    "/api",
    route_handlers=[version, tags, ps, show, chat, generate, embed, model_store, delete_model],
    exception_handlers={Exception: error_handler(ollama_error)},
)
ROUTES: list[ControllerRouterHandler] = [root, root_head, _api]
