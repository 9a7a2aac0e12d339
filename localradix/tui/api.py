"""The TUI's few calls to the server besides the stats feed: flush the cache and chat.

Every failure surfaces as `ApiError` with a one-line message fit for a notification.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from localradix.tui.env import KEY_ENV


class ApiError(Exception):
    pass


@dataclass(frozen=True)
class ChatDelta:
    text: str


@dataclass(frozen=True)
class ChatUsage:
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def auth_problem(status: int, api_key: str | None) -> str | None:
    """What to tell the user when the server answers 401/403 (None for other statuses)."""
    if status not in (401, 403):
        return None
    if not api_key:
        return f"the server needs an API key: pass --api-key / set {KEY_ENV}"
    return f"the server refused the API key (HTTP {status}): check --api-key / {KEY_ENV}"


def error_message(body: bytes | str) -> str:
    """The message of an OpenAI-shaped error body, else the body's first line."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if data.get("detail"):
            return str(data["detail"])
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else "(empty response)"


def describe_error(e: BaseException) -> str:
    """A short human reason for a failed request."""
    if isinstance(e, httpx.ConnectError):
        return "connection refused" if _refused(e) else f"cannot connect: {e}"
    if isinstance(e, httpx.TimeoutException):
        return "timed out"
    if isinstance(e, httpx.RemoteProtocolError):
        return "the server closed the connection"
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:200]


def _refused(e: BaseException | None) -> bool:
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, ConnectionRefusedError) or "refused" in str(e).lower():
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


class ApiClient:
    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.transport = transport

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers=auth_headers(self.api_key),
            timeout=httpx.Timeout(self.timeout, connect=3.0),
            transport=self.transport,
            trust_env=False,
        )

    async def flush_cache(self) -> str:
        """Flush the radix cache; the server refuses (409) while requests run."""
        try:
            async with self._client() as client:
                r = await client.post(self.url + "/v1/cache/flush")
        except httpx.HTTPError as e:
            raise ApiError(f"flush failed: {describe_error(e)}") from e
        if auth := auth_problem(r.status_code, self.api_key):
            raise ApiError(f"flush failed: {auth}")
        if r.status_code == 409:
            raise ApiError(f"flush refused: {error_message(r.content)}")
        if r.status_code != 200:
            raise ApiError(f"flush failed: HTTP {r.status_code}: {error_message(r.content)}")
        return "radix cache flushed"

    async def first_model(self) -> str | None:
        try:
            async with self._client() as client:
                r = await client.get(self.url + "/v1/models")
            data = r.json().get("data") or []
            return str(data[0]["id"]) if data else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return None

    async def chat(
        self, model: str, messages: Sequence[dict[str, str]], max_tokens: int = 512
    ) -> AsyncIterator[ChatDelta | ChatUsage]:
        """Stream a chat completion: text deltas, then one usage (with cached tokens)."""
        body = {
            "model": model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            async with self._client() as client:
                async with client.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
                    if auth := auth_problem(r.status_code, self.api_key):
                        raise ApiError(auth)
                    if r.status_code != 200:
                        msg = error_message(await r.aread())
                        raise ApiError(f"HTTP {r.status_code}: {msg}")
                    async for line in r.aiter_lines():
                        for event in chat_events(line):
                            yield event
        except httpx.HTTPError as e:
            raise ApiError(describe_error(e)) from e


def chat_events(line: str) -> list[ChatDelta | ChatUsage]:
    """The deltas and usage in one SSE line of a streamed chat completion."""
    if not line.startswith("data:"):
        return []
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return []
    try:
        chunk = json.loads(payload)
    except ValueError:
        return []
    if not isinstance(chunk, dict):
        return []
    if isinstance(chunk.get("error"), dict):
        raise ApiError(str(chunk["error"].get("message") or "error mid-stream"))
    out: list[ChatDelta | ChatUsage] = []
    for choice in chunk.get("choices") or []:
        text = ((choice or {}).get("delta") or {}).get("content")
        if text:
            out.append(ChatDelta(str(text)))
    if isinstance(chunk.get("usage"), dict):
        out.append(usage_of(chunk["usage"]))
    return out


def usage_of(usage: dict[str, Any]) -> ChatUsage:
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return ChatUsage(
        prompt_tokens=_int(usage.get("prompt_tokens")),
        cached_tokens=_int(cached),
        completion_tokens=_int(usage.get("completion_tokens")),
    )


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
