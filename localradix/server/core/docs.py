"""The OpenAPI document: every status a route can answer is declared in its dialect's error
shape (so the published schema holds no surprises), streamed answers name their content type,
and request bodies are described by msgspec from the very Structs the routes decode with
(Litestar's own generator drops some constraints: those inside unions, and zero limits),
without Litestar decoding the body a second time. Rules a Struct cannot state (one field of
several, a field that needs another) are added to its schema from `BODY_RULES`."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import Litestar
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import Link, OpenAPIMediaType, Reference, RequestBody, Schema

from localradix.server.protocol import ErrorResponse

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
REF = "#/components/schemas/{name}"


class OllamaError(msgspec.Struct):
    error: str


class AnthropicErrorDetail(msgspec.Struct):
    type: str
    message: str


class AnthropicError(msgspec.Struct):
    type: Literal["error"]
    error: AnthropicErrorDetail


WHY = {
    400: "Invalid request",
    401: "Missing or wrong API key (--api-key-file)",
    404: "Unknown model",
    409: "The model is busy or pinned",
    413: "Request body too large",
    429: "Queue full (see Retry-After)",
    503: "Engine unavailable (starting, restarting, or the hub is unreachable)",
}
REQUEST_STATUSES = (400, 401, 404, 413, 429, 503)


def errors(shape: type = ErrorResponse, statuses: tuple[int, ...] = REQUEST_STATUSES) -> dict:
    """The error responses `statuses` of a route answering in `shape` (its dialect's)."""
    return {status: ResponseSpec(shape, description=WHY[status]) for status in statuses}


AUTH = errors(statuses=(401,))
UNAVAILABLE = errors(statuses=(503,))
UNKNOWN_MODEL = errors(statuses=(404,))
ERRORS = errors()
OLLAMA_ERRORS = errors(OllamaError)
ANTHROPIC_ERRORS = errors(AnthropicError)

REPO_REF = r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(:.+)?$"  # ORG/NAME[:QUANT], as pulls take it


def _named(field: str, pattern: str = ".") -> dict[str, Any]:
    return {"required": [field], "properties": {field: {"type": "string", "pattern": pattern}}}


_MODEL = _named("model")
_ONE_NAME = [_named("model"), _named("name")]
BODY_RULES: dict[str, dict[str, Any]] = {
    # OpenAI: top_logprobs needs logprobs.
    "ChatCompletionRequest": {
        "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
    },
    # An empty prompt only with a suffix (a gap at the start of a file).
    "CompletionRequest": {
        "if": {"required": ["prompt"], "properties": {"prompt": {"const": ""}}},
        "then": {"required": ["suffix"], "properties": {"suffix": {"minLength": 1}}},
    },
    # Exactly one of content, prompt or messages (a null one counts as absent).
    "TokenizeBody": {
        "oneOf": [
            {"required": [field], "properties": {field: {"type": kind}}}
            for field, kind in (("content", "string"), ("prompt", "string"), ("messages", "array"))
        ]
    },
    # Ollama's routes need a model: `model`, or `name` in older clients' model routes.
    **dict.fromkeys(("ChatBody", "GenerateBody", "EmbedBody", "EmbeddingsBody"), _MODEL),
    **dict.fromkeys(("ModelBody", "DeleteBody"), {"anyOf": _ONE_NAME}),
    "PullBody": {"anyOf": [_named(field, REPO_REF) for field in ("model", "name")]},
}


def publish_request_bodies(app: Litestar, bodies: dict[str, type]) -> None:
    """Declare each route's JSON body (path -> Struct; the POST, else the DELETE) in the app's
    OpenAPI document, which Litestar builds once and caches."""
    schema = app.openapi_schema
    _, components = msgspec.json.schema_components(tuple(bodies.values()), ref_template=REF)
    assert schema.components is not None and schema.paths is not None
    for name, rules in BODY_RULES.items():
        if name in components:
            components[name] = {**components[name], "allOf": [rules]}
    schema.components.schemas.update(components)
    for path, struct in bodies.items():
        operation = schema.paths[path].post or schema.paths[path].delete
        assert operation is not None, path
        media = OpenAPIMediaType(schema=Reference(REF.format(name=struct.__name__)))
        operation.request_body = RequestBody(content={"application/json": media}, required=True)


def publish_link(app: Litestar, path: str, field: str, target: str, parameter: str) -> None:
    """Say that the `field` of POST `path`'s answer is the `parameter` of every operation on
    `target` (so a client, or a stateful fuzzer, can follow a created resource)."""
    schema = app.openapi_schema
    assert schema.paths is not None
    created = schema.paths[path].post
    assert created is not None and created.responses is not None
    ok = created.responses["200"]
    assert not isinstance(ok, Reference)
    item = schema.paths[target]
    operations = [op for op in (item.get, item.delete) if op is not None]
    ok.links = {
        op.operation_id or "": Link(
            operation_id=op.operation_id, parameters={parameter: f"$response.body#/{field}"}
        )
        for op in operations
    }


def publish_streams(app: Litestar, streams: dict[str, str]) -> None:
    """Add the streamed form (path -> media type) to each POST route's 200 answer (or, for a
    GET-only stream, make it the answer's only form)."""
    schema = app.openapi_schema
    assert schema.paths is not None
    for path, media_type in streams.items():
        item = schema.paths[path]
        operation = item.post or item.get
        assert operation is not None and operation.responses is not None, path
        ok = operation.responses["200"]
        assert not isinstance(ok, Reference) and ok.content is not None
        events = OpenAPIMediaType(schema=Schema(description="each event's data: JSON"))
        if item.post is None:
            ok.content.clear()
        ok.content[media_type] = events
