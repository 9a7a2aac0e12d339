"""One streamed chat completion against an OpenAI-compatible endpoint, timed chunk by chunk.

Every failure (refused connection, HTTP error, malformed stream, timeout) becomes a result with
`error` set; nothing here raises for a misbehaving server.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

ERROR_BODY_CHARS = 300


@dataclass
class RequestResult:
    session: int
    turn: int
    start: float = 0.0  # perf_counter when sent
    ttft: float | None = None  # seconds to the first content chunk
    latency: float | None = None  # seconds to the end of the stream
    chunk_times: list[float] = field(default_factory=list)  # offsets of content chunks
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from usage, when reported
    output_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def stream_tokens(self) -> int:
        """Content chunks seen; one token per chunk on most servers."""
        return len(self.chunk_times)

    @property
    def gaps(self) -> list[float]:
        """Inter-token latencies: time between consecutive content chunks."""
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


class StreamError(Exception):
    pass


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    result: RequestResult,
    headers: dict[str, str] | None = None,
    total_timeout: float | None = None,
) -> RequestResult:
    """POST `body` with stream=true to `url`; fill and return `result`.

    `total_timeout` bounds the whole request; the client's own timeouts bound each read.
    """
    result.start = time.perf_counter()
    try:
        await asyncio.wait_for(_request(client, url, body, result, headers), total_timeout)
    except StreamError as e:
        result.error = str(e)
    except asyncio.TimeoutError:
        result.error = f"timeout: no complete reply within {total_timeout:g} s"
    except httpx.TimeoutException as e:
        result.error = f"timeout: {type(e).__name__}"
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    except Exception as e:  # a benchmark reports, it does not crash
        result.error = f"{type(e).__name__}: {e}"
    result.latency = time.perf_counter() - result.start
    return result


async def _request(client, url, body, result, headers) -> None:
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            raw = await resp.aread()
            raise StreamError(f"HTTP {resp.status_code}: {_error_text(raw)}")
        await _consume(resp, result)


async def _consume(resp: httpx.Response, result: RequestResult) -> None:
    done, events = False, 0
    parts: list[str] = []
    async for line in resp.aiter_lines():
        line = line.strip()
        if not line.startswith("data:"):
            continue  # blank separators, comments, "event:" lines
        data = line[5:].strip()
        events += 1
        if data == "[DONE]":
            done = True
            break
        _on_chunk(_parse(data), result, parts)
    result.text = "".join(parts)
    if events == 0:
        kind = resp.headers.get("content-type", "no content-type")
        raise StreamError(f"response is not an event stream ({kind})")
    if not done and result.finish_reason is None:
        raise StreamError("stream ended before [DONE] and without a finish_reason")


def _parse(data: str) -> dict:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        raise StreamError(f"malformed stream chunk: {data[:80]!r}") from None
    if not isinstance(chunk, dict):
        raise StreamError(f"malformed stream chunk: {data[:80]!r}")
    if chunk.get("error"):
        raise StreamError(f"error in stream: {_error_text(json.dumps(chunk))}")
    return chunk


def _on_chunk(chunk: dict, result: RequestResult, parts: list[str]) -> None:
    now = time.perf_counter() - result.start
    if chunk.get("usage"):
        _read_usage(chunk["usage"], result)
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        piece = delta.get("content") or ""
        if piece or delta.get("reasoning_content") or delta.get("tool_calls"):
            if result.ttft is None:
                result.ttft = now
            result.chunk_times.append(now)
            parts.append(piece)
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]


def _read_usage(usage: dict, result: RequestResult) -> None:
    result.prompt_tokens = usage.get("prompt_tokens")
    result.output_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    result.cached_tokens = details.get("cached_tokens")


def _error_text(raw: bytes | str) -> str:
    """The server's error message (OpenAI shape when possible), shortened."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message") if isinstance(err, dict) else None
        text = msg or text
    except (json.JSONDecodeError, AttributeError):
        pass
    text = " ".join(text.split())
    return text[:ERROR_BODY_CHARS] or "(empty body)"
