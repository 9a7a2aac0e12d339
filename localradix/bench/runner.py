"""Drive one workload against one endpoint: sessions concurrently, turns in order, a limit on
requests in flight."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

import httpx

from localradix.bench.client import RequestResult, stream_chat
from localradix.bench.workloads import Session, Workload

SKIPPED = "not sent: an earlier turn of this conversation failed"


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # ends before /chat/completions, e.g. http://127.0.0.1:8000/v1
    model: str
    api_key: str | None = None

    @property
    def chat_url(self) -> str:
        return self.base_url + "/chat/completions"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class RunOptions:
    concurrency: int = 8
    request_timeout: float = 600.0
    warmup: int = 1
    extra_body: dict[str, Any] = field(default_factory=dict)
    progress: bool = True
    label: str = ""


@dataclass
class RunResult:
    results: list[RequestResult]
    wall_time: float
    started_at: str
    concurrency: int
    t0: float = 0.0  # perf_counter at the start of the timed run


def make_client(base_url: str, concurrency: int, timeout: float) -> httpx.AsyncClient:
    host = urlsplit(base_url).hostname or ""
    local = host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout, connect=min(timeout, 30.0)),
        limits=httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency),
        trust_env=not local,  # a proxy from the environment must not sit in front of localhost
    )


async def run_workload(endpoint: Endpoint, workload: Workload, opts: RunOptions) -> RunResult:
    concurrency = 1 if workload.sequential else max(1, opts.concurrency)
    async with make_client(endpoint.base_url, concurrency, opts.request_timeout) as client:
        await _warmup(client, endpoint, opts)
        driver = _Driver(client, endpoint, workload, opts, concurrency)
        return await driver.run()


class _Driver:
    def __init__(self, client, endpoint, workload, opts, concurrency) -> None:
        self.client, self.endpoint, self.workload, self.opts = client, endpoint, workload, opts
        self.concurrency = concurrency
        self.sem = asyncio.Semaphore(concurrency)
        self.results: list[RequestResult] = []
        self.bar = _progress_bar(workload.num_requests, opts)

    async def run(self) -> RunResult:
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        t0 = time.perf_counter()
        try:
            sessions = enumerate(self.workload.sessions)
            await asyncio.gather(*(self._session(i, s) for i, s in sessions))
        finally:
            self.bar.close()
        wall = time.perf_counter() - t0
        self.results.sort(key=lambda r: (r.session, r.turn))
        return RunResult(self.results, wall, started_at, self.concurrency, t0)

    async def _session(self, index: int, session: Session) -> None:
        messages = [{"role": "system", "content": session.system}] if session.system else []
        failed = False
        for turn, user in enumerate(session.turns):
            messages.append({"role": "user", "content": user})
            result = RequestResult(session=index, turn=turn)
            if failed:
                result.error = SKIPPED
            else:
                async with self.sem:
                    await self._send(messages, result)
                failed = not result.ok
                messages.append({"role": "assistant", "content": result.text})
            self.results.append(result)
            self.bar.update(1)

    async def _send(self, messages: list[dict], result: RequestResult) -> None:
        body = request_body(self.endpoint.model, messages, self.workload.max_tokens, self.opts)
        ep, timeout = self.endpoint, self.opts.request_timeout
        await stream_chat(self.client, ep.chat_url, body, result, ep.headers, timeout)


def request_body(model: str, messages: list[dict], max_tokens: int, opts: RunOptions) -> dict:
    return {
        "model": model,
        "messages": list(messages),
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **opts.extra_body,
    }


async def _warmup(client: httpx.AsyncClient, endpoint: Endpoint, opts: RunOptions) -> None:
    """A few tiny requests so the timed run does not pay one-off startup costs."""
    for i in range(opts.warmup):
        messages = [{"role": "user", "content": f"Warm-up {i}: say hello."}]
        body = request_body(endpoint.model, messages, 4, opts)
        result = RequestResult(session=-1, turn=i)
        await stream_chat(client, endpoint.chat_url, body, result, endpoint.headers)
        if isinstance(result.error, str) and "Connect" in result.error:
            return  # the run itself will record the failure


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, opts: RunOptions):
    if not opts.progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=opts.label or "bench", unit="req", file=sys.stderr, leave=False)
