"""The dashboard on the smg gateway of `localradix serve --replicas 2`: one snapshot merged
from every replica's stats.

`GatewayFeed` asks the URL for smg's worker list (`GET /workers`); a plain localradix server
(no such route) is read by `HttpFeed` as before. On a gateway it polls each replica's
`GET /v1/stats` and merges them: engine counters summed (so the panels show the fleet), the
running batches side by side, and a `replicas` table with each one's batch, hit rate and KV,
plus the routing hit rate (cached over looked-up prompt tokens, summed over replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from localradix.tui.api import auth_headers, describe_error
from localradix.tui.feed import Connected, Disconnected, FeedEvent, HttpFeed, Snapshot
from localradix.tui.stats import ENGINE_NUMBERS, mapping, rows

WORKERS_REFRESH_S = 2.0
BACKOFF_S = (0.5, 1.0, 2.0, 3.0)


@dataclass(frozen=True)
class Answer:
    workers: list[str] | None  # the gateway's worker URLs; None: not a gateway


class GatewayFeed:
    def __init__(self, url: str, api_key: str | None = None, *, poll_interval: float = 0.5):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.poll_interval = poll_interval

    async def events(self) -> AsyncIterator[FeedEvent]:
        async with httpx.AsyncClient(
            headers=auth_headers(self.api_key), timeout=httpx.Timeout(5.0), trust_env=False
        ) as client:
            async for event in self._probe(client):
                if not isinstance(event, Answer):
                    yield event
                elif event.workers is None:  # a plain server
                    async for plain in HttpFeed(self.url, self.api_key).events():
                        yield plain
                else:
                    yield Connected(self.url, "gateway")
                    async for fleet_event in self._fleet(client, event.workers):
                        yield fleet_event

    async def _probe(self, client: httpx.AsyncClient) -> AsyncIterator[Any]:
        """Disconnected events until the URL answers, then its Answer: a gateway that
        `localradix up --replicas 2` is still starting is waited for."""
        for attempt in itertools.count():
            try:
                yield Answer(await self._workers(client))
                return
            except httpx.HTTPError as e:
                delay = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                yield Disconnected(describe_error(e), delay)
                await asyncio.sleep(delay)

    async def _fleet(self, client: httpx.AsyncClient, workers: list[str]) -> AsyncIterator[Any]:
        refreshed = asyncio.get_running_loop().time()
        while True:
            now = asyncio.get_running_loop().time()
            if now - refreshed >= WORKERS_REFRESH_S:
                with contextlib.suppress(httpx.HTTPError):
                    workers = await self._workers(client) or workers
                refreshed = now
            payloads = await asyncio.gather(*(self._stats(client, w) for w in workers))
            if any(p is not None for p in payloads):
                yield Snapshot(merge_replicas(list(zip(workers, payloads, strict=True))))
            else:
                yield Disconnected("no replica answers", self.poll_interval)
            await asyncio.sleep(self.poll_interval)

    async def _workers(self, client: httpx.AsyncClient) -> list[str] | None:
        """The gateway's worker URLs; None if the URL answers but is not an smg gateway,
        httpx.HTTPError if it does not answer."""
        r = await client.get(self.url + "/workers")
        try:
            listed = r.json().get("workers") if r.status_code == 200 else None
        except (ValueError, AttributeError):
            return None
        if not isinstance(listed, list):
            return None
        return sorted(str(w["url"]) for w in listed if isinstance(w, dict) and w.get("url"))

    async def _stats(self, client: httpx.AsyncClient, worker: str) -> Any:
        try:
            r = await client.get(worker.rstrip("/") + "/v1/stats")
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None


def merge_replicas(replies: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """One stats payload for the fleet from (worker URL, its /v1/stats or None)."""
    answered = [(url, mapping(data)) for url, data in replies if data is not None]
    engines = [mapping(data.get("engine")) for _, data in answered]
    engine: dict[str, Any] = {k: _sum(e.get(k) for e in engines) for k in ENGINE_NUMBERS}
    for table in ("requests", "top_prefixes", "recent_misses"):
        engine[table] = [row for e in engines for row in rows(e.get(table))]
    hit, miss = engine["cache_hit_tokens"] or 0, engine["cache_miss_tokens"] or 0
    first = answered[0][1] if answered else {}
    return {
        "model": mapping(first.get("model")),
        "uptime_s": first.get("uptime_s"),
        "time": first.get("time"),
        "engine_alive": all(d.get("engine_alive") is not False for _, d in answered),
        "engine": engine,
        "replicas": [_replica_row(url, data) for url, data in replies],
        "routing_hit_rate": hit / (hit + miss) if hit + miss else None,
    }


def _replica_row(url: str, data: Any) -> dict[str, Any]:
    engine = mapping(mapping(data).get("engine"))
    hit, miss = engine.get("cache_hit_tokens"), engine.get("cache_miss_tokens")
    looked_up = (hit or 0) + (miss or 0)
    return {
        "url": url,
        "up": data is not None and mapping(data).get("engine_alive") is not False,
        "running": engine.get("running"),
        "queued": engine.get("queued"),
        "hit_rate": (hit or 0) / looked_up if looked_up else None,
        "kv_used": engine.get("kv_used"),
        "kv_total": engine.get("kv_total"),
    }


def _sum(values: Any) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(numbers) if numbers else None


__all__ = ["GatewayFeed", "merge_replicas"]
