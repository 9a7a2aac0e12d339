"""The stats feed: snapshots from the server, plus connection changes, as one async stream.

`HttpFeed` reads the SSE stream `GET /v1/stats/stream`; a server without it (404/405) is polled
on `GET /v1/stats` instead. Any failure becomes a `Disconnected` event and a retry after a
short backoff; it never raises. Tests inject any object with the same `events()` method.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from localradix.tui.api import auth_headers, auth_problem, describe_error, error_message


@dataclass(frozen=True)
class Snapshot:
    data: Any  # the decoded JSON of one snapshot


@dataclass(frozen=True)
class Connected:
    url: str
    mode: str  # "sse" | "poll"


@dataclass(frozen=True)
class Disconnected:
    reason: str
    retry_in: float
    auth: bool = False  # the server answered, but wants a (different) API key


FeedEvent = Snapshot | Connected | Disconnected


class Feed(Protocol):
    url: str

    def events(self) -> AsyncIterator[FeedEvent]: ...


class FeedError(Exception):
    """A server that answers, but not with stats (bad status, auth)."""


class FeedAuthError(FeedError):
    """The server answered 401/403."""


class HttpFeed:
    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        poll_interval: float = 0.25,
        timeout: float = 5.0,
        backoff: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.backoff = backoff
        self.transport = transport
        self.sse: bool | None = None  # None: not known yet

    async def events(self) -> AsyncIterator[FeedEvent]:
        failures = 0
        async with self._client() as client:
            while True:
                connected = False
                try:
                    async for data in self._snapshots(client):
                        if not connected:
                            connected, failures = True, 0
                            yield Connected(self.url, "sse" if self.sse else "poll")
                        yield Snapshot(data)
                    reason, auth = "the stats stream ended", False
                except (httpx.HTTPError, FeedError, OSError) as e:
                    reason, auth = describe_error(e), isinstance(e, FeedAuthError)
                delay = self.backoff[min(failures, len(self.backoff) - 1)]
                failures += 1
                yield Disconnected(reason, delay, auth)
                await asyncio.sleep(delay)

    def _client(self) -> httpx.AsyncClient:
        timeout = httpx.Timeout(self.timeout, connect=min(self.timeout, 2.0))
        return httpx.AsyncClient(
            headers=auth_headers(self.api_key),
            timeout=timeout,
            transport=self.transport,
            trust_env=False,
        )

    def _snapshots(self, client: httpx.AsyncClient) -> AsyncIterator[Any]:
        return self._poll(client) if self.sse is False else self._stream(client)

    async def _stream(self, client: httpx.AsyncClient) -> AsyncIterator[Any]:
        async with client.stream("GET", self.url + "/v1/stats/stream") as r:
            if r.status_code in (404, 405):
                self.sse = False
                async for data in self._poll(client):
                    yield data
                return
            await check(r, self.api_key)
            self.sse = True
            async for line in r.aiter_lines():
                data = parse_sse_line(line)
                if data is not None:
                    yield data

    async def _poll(self, client: httpx.AsyncClient) -> AsyncIterator[Any]:
        while True:
            r = await client.get(self.url + "/v1/stats")
            await check(r, self.api_key)
            try:
                yield r.json()
            except ValueError as e:
                raise FeedError(f"/v1/stats did not return JSON: {e}") from e
            await asyncio.sleep(self.poll_interval)


async def check(r: httpx.Response, api_key: str | None = None) -> None:
    if r.status_code == 200:
        return
    body = await r.aread()
    if auth := auth_problem(r.status_code, api_key):
        raise FeedAuthError(auth)
    raise FeedError(f"HTTP {r.status_code}: {error_message(body)}")


def parse_sse_line(line: str) -> Any:
    """The JSON of one `data:` line; None for comments, other fields and malformed data."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    try:
        return json.loads(payload)
    except ValueError:
        return None
