"""A fake localradix server for the TUI tests: real HTTP (uvicorn in a thread), set numbers.

Serves GET /health, /v1/models, /v1/stats, /v1/stats/stream (SSE, unless `sse=False`),
POST /v1/cache/flush (409 while `busy`) and a streaming POST /v1/chat/completions whose usage
reports `cached_tokens`. It can be stopped and started again on the same port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import uvicorn
from tui_fakes import snapshot


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeStatsServer:
    def __init__(self, *, api_key: str | None = None, sse: bool = True) -> None:
        self.stats: dict[str, Any] = snapshot()
        self.api_key, self.sse = api_key, sse
        self.busy = False
        self.flushes = 0
        self.chats: list[dict[str, Any]] = []
        self.port = free_port()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeStatsServer:
        config = uvicorn.Config(
            self, host="127.0.0.1", port=self.port, log_level="error", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake stats server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._server.force_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        headers = dict(scope["headers"])
        if self.api_key and headers.get(b"authorization") != f"Bearer {self.api_key}".encode():
            await _json(send, 401, {"error": {"message": "invalid API key"}})
        elif method == "GET" and path == "/health":
            await _json(send, 200, {"status": "ok"})
        elif method == "GET" and path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": "fake-model"}]})
        elif method == "GET" and path == "/v1/stats":
            await _json(send, 200, self.stats)
        elif method == "GET" and path == "/v1/stats/stream" and self.sse:
            await self.stream_stats(receive, send)
        elif method == "POST" and path == "/v1/cache/flush":
            await self.flush(send)
        elif method == "POST" and path == "/v1/chat/completions":
            await self.chat(json.loads(await _body(receive)), send)
        else:
            await _json(send, 404, {"error": {"message": f"no route {method} {path}"}})

    async def stream_stats(self, receive: Any, send: Any) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        await send(_start(200, b"text/event-stream"))
        try:
            while not gone.is_set() and self._server is not None:
                if self._server.should_exit:
                    break
                body = b"data: " + json.dumps(self.stats).encode() + b"\n\n"
                await send({"type": "http.response.body", "body": body, "more_body": True})
                await asyncio.sleep(0.05)
            await send({"type": "http.response.body", "body": b""})
        finally:
            watcher.cancel()

    async def flush(self, send: Any) -> None:
        self.flushes += 1
        if self.busy:
            message = "cannot flush the cache while requests are running; retry when idle"
            await _json(send, 409, {"error": {"message": message, "code": 409}})
        else:
            await _json(send, 200, {"flushed": True})

    async def chat(self, body: dict[str, Any], send: Any) -> None:
        self.chats.append(body)
        await send(_start(200, b"text/event-stream"))
        for word in ("Ahoy", ", ", "matey"):
            chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
            await _sse(send, chunk)
        usage = {
            "prompt_tokens": 50,
            "completion_tokens": 3,
            "total_tokens": 53,
            "prompt_tokens_details": {"cached_tokens": 45},
        }
        await _sse(send, {"choices": [], "usage": usage})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def _start(status: int, content_type: bytes) -> dict[str, Any]:
    return {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", content_type)],
    }


async def _sse(send: Any, payload: Any) -> None:
    body = b"data: " + json.dumps(payload).encode() + b"\n\n"
    await send({"type": "http.response.body", "body": body, "more_body": True})


async def _json(send: Any, status: int, payload: Any) -> None:
    await send(_start(status, b"application/json"))
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)
