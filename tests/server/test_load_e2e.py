"""Load and slow clients, end to end on the bundled model (one server for the module): bursts of
concurrent streams are each served or refused with 429/503 and Retry-After, none hangs, and once
idle the KV accounting shows nothing used or locked; half-open connections do not stop others.

Each test prints its figures (served / refused / errored / hung, p50 / p99 latency)."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
from dataclasses import dataclass

import httpx
import pytest
from server_harness import start_server, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HANG_S = 300.0  # a request without an answer this long counts as hung
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def server():
    args = ["--backend", "cpu", "--max-total-tokens", "16384", "--max-running-requests", "64"]
    s = start_server(args, fake=False)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@dataclass
class Result:
    kind: str  # served | refused | disconnected | errored | hung
    seconds: float
    detail: str = ""


def body(i: int) -> dict:
    return {
        "messages": [{"role": "user", "content": f"Give me one word for the number {i}."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
    }


async def one_stream(client: httpx.AsyncClient, i: int, disconnect: bool) -> Result:
    start = time.monotonic()

    async def run() -> Result:
        async with client.stream("POST", "/v1/chat/completions", json=body(i)) as r:
            if r.status_code in (429, 503):
                ok = int(r.headers.get("retry-after", "0")) > 0
                return Result(
                    "refused" if ok else "errored", 0.0, f"{r.status_code} no Retry-After"
                )
            if r.status_code != 200:
                return Result("errored", 0.0, f"http {r.status_code}: {(await r.aread())[:200]!r}")
            events = []
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if disconnect and '"content":"' in line and '"content":""' not in line:
                    return Result("disconnected", 0.0)  # leaving the block closes the stream
            if events[-1:] != ["[DONE]"] or any('"error"' in e for e in events):
                return Result("errored", 0.0, f"stream ended with {events[-2:]}")
            finishes = [json.loads(e)["choices"] for e in events[:-1]]
            if not any(c.get("finish_reason") for cs in finishes for c in cs):
                return Result("errored", 0.0, "no finish_reason")
            return Result("served", 0.0)

    try:
        result = await asyncio.wait_for(run(), HANG_S)
    except TimeoutError:
        result = Result("hung", 0.0)
    except httpx.HTTPError as exc:
        result = Result("errored", 0.0, repr(exc))
    result.seconds = time.monotonic() - start
    return result


async def burst(url: str, count: int, disconnect_every: int = 0) -> list[Result]:
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(HANG_S, connect=60)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        return await asyncio.gather(
            *(
                one_stream(client, i, bool(disconnect_every) and i % disconnect_every == 0)
                for i in range(count)
            )
        )


def summary(name: str, results: list[Result]) -> dict[str, int]:
    counts = {k: 0 for k in ("served", "refused", "disconnected", "errored", "hung")}
    for r in results:
        counts[r.kind] += 1
    times = sorted(r.seconds for r in results if r.kind == "served")
    p50 = statistics.median(times) if times else float("nan")
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))] if times else float("nan")
    print(f"\n{name}: {counts}, served latency p50 {p50:.1f} s, p99 {p99:.1f} s")
    return counts


def idle_and_nothing_held(server) -> bool:
    """The leak check: no request open or running, no KV slot used, no cached prefix locked."""
    s = httpx.get(server.base + "/stats", timeout=10).json()
    engine = s["engine"] or {}
    return (
        s["server"]["in_flight"] == 0
        and engine.get("running") == 0
        and engine.get("queued") == 0
        and engine.get("kv_used") == 0
        and not any(row["locked"] for row in engine.get("top_prefixes", ()))
    )


def assert_no_leak(server) -> None:
    assert wait_until(lambda: idle_and_nothing_held(server), timeout=30, interval=0.2), httpx.get(
        server.base + "/stats"
    ).json()


def test_200_concurrent_streams_in_one_burst(server):
    results = asyncio.run(burst(server.url, 200))
    counts = summary("200 concurrent streams", results)
    bad = [r for r in results if r.kind in ("errored", "hung")]
    assert not bad, bad[:5]
    assert counts["served"] + counts["refused"] == 200 and counts["served"] > 0
    assert_no_leak(server)


def test_300_streams_half_disconnecting_after_the_first_token(server):
    results = asyncio.run(burst(server.url, 300, disconnect_every=2))
    counts = summary("300 streams, half disconnecting", results)
    bad = [r for r in results if r.kind in ("errored", "hung")]
    assert not bad, bad[:5]
    assert counts["disconnected"] + counts["refused"] >= 1 and counts["served"] > 0
    assert sum(counts.values()) == 300
    assert_no_leak(server)
    assert httpx.get(server.url + "/health").status_code == 200


def test_50_half_open_connections_do_not_stop_others(server):
    host, port = server.url.removeprefix("http://").split(":")

    def timed_chat() -> float:
        start = time.monotonic()
        r = httpx.post(
            server.base + "/chat/completions", json={**body(7), "stream": False}, timeout=60
        )
        assert r.status_code == 200, r.text
        return time.monotonic() - start

    baseline = min(timed_chat() for _ in range(3))
    slow = []
    try:
        for i in range(50):
            sock = socket.create_connection((host, int(port)), timeout=10)
            if i % 2:  # headers never finished
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            else:  # headers done, the body trickles
                head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                sock.sendall(
                    head + b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n{"
                )
            slow.append(sock)
        loaded = [timed_chat() for _ in range(5)]
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    finally:
        for sock in slow:
            sock.close()
    print(
        f"\nchat with 50 half-open connections held: {max(loaded):.2f} s worst of 5 "
        f"(alone: {baseline:.2f} s)"
    )
    assert max(loaded) < max(10 * baseline, 10.0)
    assert_no_leak(server)
