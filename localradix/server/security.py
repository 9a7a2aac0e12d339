"""Who may use the server: the Host and Origin a browser sends, the API key, JSON bodies.

A web page can send a "simple" cross-origin POST (text/plain, a form) without any CORS
preflight, and DNS rebinding lets a page on `evil.example` read a loopback server's answers
under its own name. So before any route runs:
- a loopback server answers only to loopback names, the bound host and `--allowed-hosts`
  (421 otherwise);
- a request carrying a foreign `Origin` is refused (403) unless `--cors-origins` lists it;
- with API keys, every route but `/health` needs `Authorization: Bearer KEY` or
  `x-api-key: KEY` (401) with one of them; the route learns which (`caller_of`: a digest, never
  the key), so what a caller keeps on the server (stored responses) stays its own;
- a body sent with a `Content-Type` other than JSON is refused (415).
CORS (the preflight and the response headers) is answered here too, for the listed origins only,
so that every refusal, preflight included, is an OpenAI-shaped JSON error.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from localradix.config import ServerArgs
from localradix.server.errors import APIError

API_KEY_ENV = "LOCALRADIX_API_KEY"
OPEN_PATHS = frozenset({"/health"})  # answered without the key (liveness probes)
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
CORS_MAX_AGE_S = 600

ASGIApp = Callable[[Any, Any, Any], Any]
CALLER = "localradix.caller"  # the scope key holding the caller's key digest (None: no keys)


class ApiKeyError(ValueError):
    """The key file cannot be read or is empty."""


def resolve_api_keys(args: ServerArgs, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The keys the server accepts: --api-key, else every line of --api-key-file (blank lines
    and `#` comments skipped: one key per user or tool), else $LOCALRADIX_API_KEY (): no key)."""
    if args.api_key:
        return (args.api_key,)
    if args.api_key_file:
        try:
            text = Path(args.api_key_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ApiKeyError(f"cannot read --api-key-file: {exc}") from None
        lines = (line.strip() for line in text.splitlines())
        keys = tuple(dict.fromkeys(k for k in lines if k and not k.startswith("#")))
        if not keys:
            raise ApiKeyError(f"--api-key-file {args.api_key_file} holds no key")
        return keys
    env = os.environ if environ is None else environ
    key = env.get(API_KEY_ENV)
    return (key,) if key else ()


def resolve_api_key(args: ServerArgs, environ: dict[str, str] | None = None) -> str | None:
    """The key a client of this server sends (the file's first, where it lists several)."""
    keys = resolve_api_keys(args, environ)
    return keys[0] if keys else None


def caller_of(scope: Mapping[str, object]) -> str | None:
    """Which key the request proved (a digest), or None when the server has no keys."""
    caller = scope.get(CALLER)
    return caller if isinstance(caller, str) else None


def is_loopback(host: str) -> bool:
    """`localhost`, `*.localhost` (RFC 6761), 127.0.0.0/8, ::1 (also IPv4-mapped)."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def host_name(header: str) -> str:
    """`Host` header -> the name without the port: `[::1]:8000` -> `::1`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header[1:]
    if header.count(":") == 1:
        header = header.split(":", 1)[0]
    return header.rstrip(".")


@dataclass(frozen=True)
class AccessPolicy:
    check_host: bool
    hosts: frozenset[str]  # allowed besides loopback names
    origins: frozenset[str]  # allowed cross origins ("*": any)
    api_keys: tuple[bytes, ...]  # the accepted Authorization headers (): no key needed)
    previews: bool  # prompt previews may appear in the stats feed

    @classmethod
    def from_args(cls, args: ServerArgs, api_keys: tuple[str, ...]) -> AccessPolicy:
        allowed = {host_name(h) for h in args.allowed_hosts}
        return cls(
            check_host="*" not in allowed and (is_loopback(args.host) or bool(allowed)),
            hosts=frozenset(allowed | {host_name(args.host)}),
            origins=frozenset(o.rstrip("/").lower() for o in args.cors_origins),
            api_keys=tuple(f"Bearer {key}".encode() for key in api_keys),
            previews=not args.no_prompt_previews,
        )

    def check(self, scope: dict[str, Any], headers: dict[str, str]) -> None:
        """Raise the APIError that refuses this request, if any."""
        host = headers.get("host", "")
        if self.check_host and host and not self._host_allowed(host_name(host)):
            raise APIError(
                421,
                f"this server does not answer to the host name '{host_name(host)}' (a guard "
                "against DNS rebinding); use localhost or 127.0.0.1, or start the server with "
                f"--allowed-hosts {host_name(host)}",
                code="host_not_allowed",
            )
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, host):
            raise APIError(
                403,
                f"cross-origin requests from '{origin}' are refused; start the server with "
                f"--cors-origins {origin} to allow that page",
                code="origin_not_allowed",
            )
        if self.api_keys and scope["method"] != "OPTIONS":
            scope[CALLER] = self.caller(headers)
            if scope["path"] not in OPEN_PATHS and scope[CALLER] is None:
                raise APIError(
                    401,
                    "a valid API key is required: 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                    code="invalid_api_key",
                )
        content_type = headers.get("content-type")
        if scope["method"] in BODY_METHODS and content_type is not None:
            if not _is_json(content_type):
                raise APIError(
                    415,
                    f"the request body must be JSON sent with 'Content-Type: application/json', "
                    f"not '{content_type}'",
                    code="unsupported_media_type",
                )

    def caller(self, headers: dict[str, str]) -> str | None:
        """`Authorization: Bearer KEY`, or `x-api-key: KEY` (what Anthropic's clients send): a
        digest of the key it matches (every key compared, in constant time), else None."""
        bearer = headers.get("authorization", "").encode()
        x_api_key = f"Bearer {headers.get('x-api-key', '')}".encode()
        found = None
        for key in self.api_keys:
            if hmac.compare_digest(bearer, key) | hmac.compare_digest(x_api_key, key):
                found = key
        return hashlib.sha256(found).hexdigest()[:16] if found is not None else None

    def authenticated(self, headers: dict[str, str]) -> bool:
        return bool(self.api_keys) and self.caller(headers) is not None

    def shows_previews(self, scope: dict[str, Any]) -> bool:
        """Prompt text goes only to clients that proved the key, or on this machine."""
        if not self.previews:
            return False
        if self.api_keys:
            return self.authenticated(_headers(scope))
        client = scope.get("client") or ("",)
        return is_loopback(str(client[0]))

    def _host_allowed(self, name: str) -> bool:
        return is_loopback(name) or name in self.hosts

    def cors_allows(self, origin: str) -> bool:
        """Whether `--cors-origins` lets pages from `origin` call the server."""
        return "*" in self.origins or origin.rstrip("/").lower() in self.origins

    def _origin_allowed(self, origin: str, host: str) -> bool:
        if self.cors_allows(origin):
            return True
        normal = origin.rstrip("/").lower()
        parts = urlsplit(normal)  # same origin: the page was served by this very server
        return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host.lower()


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def access_middleware(
    policy: AccessPolicy,
    on_refusal: Callable[[int], None],
    error_body: Callable[[str, APIError], Any] = lambda path, err: err.body(),
) -> Callable[[ASGIApp], ASGIApp]:
    """Litestar middleware: refuse (in the shape `error_body(path, err)` gives the path's
    dialect; `on_refusal(status)` counts it), answer an allowed origin's CORS preflight, or
    pass the request on."""

    def middleware(app: ASGIApp) -> ASGIApp:
        async def guarded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            headers = _headers(scope)
            origin = headers.get("origin")
            if origin is not None and policy.cors_allows(origin):
                send = _with_cors(send, origin)
            try:
                policy.check(scope, headers)
            except APIError as err:
                on_refusal(err.status)
                await _send_json(send, err.status, error_body(scope["path"], err), err.headers)
                return
            if origin is not None and scope["method"] == "OPTIONS":
                if "access-control-request-method" in headers:
                    await _send_preflight(send, headers)
                    return
            await app(scope, receive, send)

        return guarded

    return middleware


def _with_cors(send: Any, origin: str) -> Any:
    async def cors_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            extra = [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return cors_send


async def _send_preflight(send: Any, headers: dict[str, str]) -> None:
    wanted = headers.get("access-control-request-headers", "authorization, content-type")
    await send(
        {
            "type": "http.response.start",
            "status": 204,
            "headers": [
                (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                (b"access-control-allow-headers", wanted.encode("latin-1")),
                (b"access-control-max-age", str(CORS_MAX_AGE_S).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


async def _send_json(send: Any, status: int, payload: Any, headers: dict[str, str]) -> None:
    body = msgspec.json.encode(payload)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
