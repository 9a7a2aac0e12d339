"""Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure the server can produce goes through `error_response`, including Litestar's own
(validation, 404/405, 413) and unexpected exceptions, so clients always get the same shape.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

logger = logging.getLogger("localradix.server")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ERROR_TYPES.get(status, "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def error_response(err: APIError) -> Response[Any]:
    return Response(err.body(), status_code=err.status, headers=err.headers)


_PATH = re.compile(r" - at `\$\.?(?P<path>[^`]*)`")


def from_decode_error(exc: msgspec.MsgspecError, field: str | None = None) -> APIError:
    """A strict msgspec decode failure as a 400 naming the field (`$.messages[0].role`);
    `field`: the body's field the decoded value was (its path inside follows the name)."""
    text = str(exc)
    match = _PATH.search(text)
    if isinstance(exc, msgspec.ValidationError):
        param = _joined(field, match.group("path") if match else None)
        message = _PATH.sub("", text)
        return bad_request(f"{message} (at '{param}')" if param else message, param)
    return bad_request(f"the request body is not valid JSON: {text}")


def _joined(field: str | None, path: str | None) -> str | None:
    """`field` and the path inside it: tools + [0].name -> tools[0].name, format + type ->
    format.type."""
    if field is None or not path:
        return field if field is not None else path or None
    return field + path if path.startswith("[") else f"{field}.{path}"


def _from_validation(exc: ValidationException) -> APIError:
    extra = exc.extra if isinstance(exc.extra, list) else []
    first = extra[0] if extra and isinstance(extra[0], dict) else {}
    param = first.get("key")
    message = first.get("message") or str(exc.detail)
    if param and param != "data":
        return bad_request(f"{message} (at '{param}')", param)
    return bad_request(f"invalid request body: {message}")


def _from_http(exc: HTTPException) -> APIError:
    status = exc.status_code
    headers = dict(exc.headers or {})
    detail = str(exc.detail)
    if status == 404:
        detail = f"{detail}: there is no such route"
    elif status == 413:
        detail = f"the request body is too large ({detail})"
    return APIError(status, detail, headers=headers)


# nginx's "client closed request": counted apart from the server's own errors (the client
# left mid-upload; no one reads the answer, and it must not look like a 5xx to alerting).
CLIENT_CLOSED = 499


def _client_left(exc: Exception) -> bool:
    """Litestar reports a client that hung up while sending its body as an internal error."""
    return (
        isinstance(exc, HTTPException)
        and exc.status_code == 500
        and "client disconnected" in str(exc.detail)
    )


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, APIError):
        err = exc
    elif isinstance(exc, ValidationException):
        err = _from_validation(exc)
    elif isinstance(exc, RecursionError):  # JSON nested deeper than the decoder allows
        err = bad_request("the request body is nested too deeply")
    elif _client_left(exc):
        logger.info("client disconnected during its request to %s", request.url.path)
        err = APIError(CLIENT_CLOSED, "the client closed the connection before its request ended")
    elif isinstance(exc, HTTPException):
        if exc.status_code >= 500:
            logger.error("HTTP %d on %s: %s", exc.status_code, request.url.path, exc.detail)
        err = _from_http(exc)
    else:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        err = APIError(500, f"internal server error: {type(exc).__name__}")
    return error_response(err)
