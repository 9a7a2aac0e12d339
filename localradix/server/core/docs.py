"""The OpenAPI document: every status a route can answer is declared (so the published schema
holds no surprises), and request bodies are described by msgspec from the very Structs the
routes decode with (Litestar's own generator drops some constraints: those inside unions, and
zero limits), without Litestar decoding the body a second time."""

from __future__ import annotations

import msgspec
from litestar import Litestar
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, Reference, RequestBody

from localradix.server.protocol import ErrorResponse

AUTH = {401: ResponseSpec(ErrorResponse, description="Missing or wrong API key (--api-key)")}
UNAVAILABLE = {503: ResponseSpec(ErrorResponse, description="Engine unavailable")}
UNKNOWN_MODEL = {404: ResponseSpec(ErrorResponse, description="Unknown model")}
ERRORS = {
    400: ResponseSpec(ErrorResponse, description="Invalid request"),
    **AUTH,
    **UNKNOWN_MODEL,
    413: ResponseSpec(ErrorResponse, description="Request body too large"),
    429: ResponseSpec(ErrorResponse, description="Queue full (see Retry-After)"),
    **UNAVAILABLE,
}
REF = "#/components/schemas/{name}"


def publish_request_bodies(app: Litestar, bodies: dict[str, type]) -> None:
    """Declare each POST route's JSON body (path -> Struct) in the app's OpenAPI document,
    which Litestar builds once and caches."""
    schema = app.openapi_schema
    _, components = msgspec.json.schema_components(tuple(bodies.values()), ref_template=REF)
    assert schema.components is not None and schema.paths is not None
    schema.components.schemas.update(components)
    for path, struct in bodies.items():
        operation = schema.paths[path].post
        assert operation is not None
        ref = Reference(REF.format(name=struct.__name__))
        media = OpenAPIMediaType(schema=ref)
        operation.request_body = RequestBody(content={"application/json": media}, required=True)
