"""A tiny OpenAI-compatible server for the bench tests: real HTTP, predictable numbers.

Tokens are whitespace-separated words. Each reply streams exactly `max_tokens` one-token
chunks, then a usage chunk whose `cached_tokens` is the longest prefix shared with any earlier
prompt (a perfect prefix cache). The model name selects a misbehaviour:

  fake             well-behaved               no-usage   no usage chunk
  fail-500         HTTP 500 with an error     malformed  a chunk that is not JSON
  truncated        stream cut before the end  stream-error  an error object mid-stream
  flaky            every second request fails with HTTP 500
  slow             waits SLOW_S before the first token (for timeouts)
  json             answers with plain JSON, not an event stream

Run standalone with `python fake_openai_server.py --port P` (used for launch/cmd tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from typing import Any

import uvicorn

TOKEN_DELAY_S = 0.001
SLOW_S = 5.0
MODELS = (
    "fake", "no-usage", "fail-500", "malformed", "truncated", "stream-error", "flaky", "slow",
    "json",
)  # fmt: skip


class FakeOpenAI:
    """The ASGI app; `requests` records every chat body received, in arrival order, and
    `max_in_flight` the most chat requests it served at once."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.prompts: list[list[str]] = []
        self.count = 0
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/health":
            await _json(send, 200, {"status": "ok"})
        elif method == "GET" and path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": m} for m in MODELS]})
        elif method == "POST" and path == "/v1/chat/completions":
            await self.chat(json.loads(await _body(receive)), send)
        else:
            await _json(send, 404, {"error": {"message": f"no route {method} {path}"}})

    async def chat(self, body: dict[str, Any], send) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self._chat(body, send)
        finally:
            self.in_flight -= 1

    async def _chat(self, body: dict[str, Any], send) -> None:
        self.requests.append(body)
        self.count += 1
        model = body.get("model", "fake")
        if model == "fail-500" or (model == "flaky" and self.count % 2 == 0):
            await _json(send, 500, {"error": {"message": "boom", "type": "server_error"}})
            return
        if model == "json":
            await _json(send, 200, {"id": "x", "object": "chat.completion", "choices": []})
            return
        prompt = [w for m in body["messages"] for w in f"{m['role']}: {m['content']}".split()]
        cached = max((_common(prompt, p) for p in self.prompts), default=0)
        self.prompts.append(prompt)
        await _start_stream(send)
        if model == "slow":
            await asyncio.sleep(SLOW_S)
        n = int(body.get("max_tokens") or 16)
        for i in range(n):
            await asyncio.sleep(TOKEN_DELAY_S)
            if model == "malformed" and i == 1:
                await _event(send, "{this is not json")
                return await _end(send)
            if model == "truncated" and i == 2:
                return await _end(send)
            if model == "stream-error" and i == 1:
                await _event(send, json.dumps({"error": {"message": "kv cache exhausted"}}))
                return await _end(send)
            await _event(send, json.dumps(_chunk({"content": f"w{i} "}, None)))
        await _event(send, json.dumps(_chunk({}, "length")))
        if model != "no-usage":
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": n,
                "total_tokens": len(prompt) + n,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            await _event(send, json.dumps({"id": "x", "choices": [], "usage": usage}))
        await _event(send, "[DONE]")
        await _end(send)


def _chunk(delta: dict, finish: str | None) -> dict:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "x", "object": "chat.completion.chunk", "created": 0, "choices": [choice]}


def _common(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def _body(receive) -> bytes:
    chunks, more = [], True
    while more:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        more = msg.get("more_body", False)
    return b"".join(chunks)


async def _json(send, status: int, obj: dict) -> None:
    data = json.dumps(obj).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _start_stream(send) -> None:
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})


async def _event(send, data: str) -> None:
    await send(
        {"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True}
    )


async def _end(send) -> None:
    await send({"type": "http.response.body", "body": b""})


class ServerThread:
    """Serve a FakeOpenAI on 127.0.0.1 (a free port) from a background thread."""

    def __init__(self) -> None:
        self.app = FakeOpenAI()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", access_log=False,
            timeout_graceful_shutdown=1,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, args=([self.sock],), daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--fail", action="store_true", help="exit at once (a launch that fails)")
    args = ap.parse_args()
    if args.fail:
        raise SystemExit("fake server: refusing to start (--fail)")
    uvicorn.run(FakeOpenAI(), host="127.0.0.1", port=args.port, log_level="warning")
