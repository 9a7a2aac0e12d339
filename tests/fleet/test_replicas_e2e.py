"""`localradix serve --replicas 2` behind smg, end to end on the bundled model (real processes).

One fleet per module. The same chat workload (4 conversations x 3 turns, max_tokens 8) runs
against one replica alone (the single-server baseline), through the fleet's own gateway
(cache_aware) and through a second smg gateway over the same replicas (round_robin); each run
opens its prompts with its own nonce, so no run reuses another's cache. Then the busier replica
is killed under four long streams: exactly the streams it ran fail, requests sent right after
the kill are routed around it, the supervisor restarts it and the gateway routes to it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from localradix.bench.runner import Endpoint, RunOptions, RunResult, run_workload
from localradix.bench.workloads import Sizes, build_workload
from localradix.child_server import free_port
from localradix.config import ServerArgs
from localradix.fleet.gateway import gateway_argv

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SIZES = Sizes(num_conversations=4, turns=3, max_tokens=8)
SERVER_ARGS = ["--max-total-tokens", "8192", "--log-level", "info"]
REPLICA_LINE = re.compile(r"(replica \d) on (http://\S+), pid (\d+)")


@dataclass
class Fleet:
    proc: subprocess.Popen
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def replicas(self) -> dict[str, tuple[str, int]]:
        """name -> (url, pid), the latest line per replica (a restart logs a new pid)."""
        found: dict[str, tuple[str, int]] = {}
        for name, url, pid in REPLICA_LINE.findall(self.log()):
            found[name] = (url, int(pid))
        return found


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def wait_for(check, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} while waiting for {what}")
        try:
            value = check()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="localradix-fleet-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "localradix", "serve", "--replicas", "2", "--port", str(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*cmd, *SERVER_ARGS], stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=REPO
        )
    running = Fleet(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        wait_for(lambda: "serving 2 replicas" in running.log(), 240, "the fleet", proc)
        wait_for(lambda: len(healthy_workers(running.url)) == 2, 60, "smg to see 2 workers")
        yield running
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        print(running.log()[-3000:])
    assert code == 0, running.log()[-3000:]
    for _, (_, pid) in running.replicas().items():
        assert not _alive(pid), f"replica pid {pid} outlived the fleet"


@pytest.fixture(scope="module")
def round_robin(fleet: Fleet) -> Iterator[str]:
    """A second smg over the fleet's replicas, round_robin."""
    port = free_port()
    args = ServerArgs(port=port, router_policy="round_robin", log_level="warning")
    urls = [url for url, _ in fleet.replicas().values()]
    proc = subprocess.Popen(
        gateway_argv(args, urls, free_port()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(healthy_workers(url)) == 2, 60, "round_robin smg", proc)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def healthy_workers(url: str) -> list[str]:
    workers = httpx.get(url + "/workers", timeout=5).json().get("workers", [])
    return [w["url"] for w in workers if w.get("is_healthy")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def model_of(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]


def chat(url: str, model: str, nonce: str) -> RunResult:
    workload = build_workload("chat", SIZES, nonce=nonce)
    opts = RunOptions(concurrency=4, warmup=0, progress=False, request_timeout=120)
    return asyncio.run(run_workload(Endpoint(url + "/v1", model), workload, opts))


def hit_share(run: RunResult) -> float:
    """Cached prompt tokens over prompt tokens, over every request."""
    assert all(r.ok for r in run.results), [r.error for r in run.results if not r.ok]
    prompt = sum(r.prompt_tokens or 0 for r in run.results)
    return sum(r.cached_tokens or 0 for r in run.results) / prompt


def test_cache_aware_routing_keeps_the_single_server_hit_rate(fleet: Fleet, round_robin: str):
    replica_url = next(iter(fleet.replicas().values()))[0]
    model = model_of(replica_url)
    single = hit_share(chat(replica_url, model, "single"))
    cache_aware = hit_share(chat(fleet.url, model, "cache-aware"))
    round_robin_share = hit_share(chat(round_robin, model, "round-robin"))
    print(
        f"\ncached share of prompt tokens: single server {single:.1%}, 2 replicas "
        f"cache_aware {cache_aware:.1%}, round_robin {round_robin_share:.1%}"
    )
    assert single > 0.3  # the workload does share prefixes
    assert cache_aware >= 0.8 * single


def test_a_killed_replica_loses_only_its_in_flight_requests_and_comes_back(
    fleet: Fleet, round_robin: str
):
    """Four long streams run, each past its first token; the busier replica is killed.

    Every stream has reached a replica's engine before the replicas are counted and none can
    end before the kill (256 tokens), so the streams lost must be exactly the ones it ran.
    """
    replicas = fleet.replicas()
    model = model_of(fleet.url)
    killed = asyncio.run(_kill_the_busier_replica(fleet.url, round_robin, model, replicas))
    print(f"\nkilled {killed.name} with {killed.running} streams on it: {killed.lost} lost")
    assert killed.lost == killed.running, killed.errors
    assert killed.served_after_the_kill == 2 * AFTER_THE_KILL  # both gateways routed around it

    name, url, pid = killed.name, *replicas[killed.name]
    new_pid = wait_for(lambda: _new_pid(fleet, name, pid), 120, "the supervisor's restart")
    assert new_pid != pid and not _alive(pid)
    wait_for(lambda: url in healthy_workers(fleet.url), 60, "the gateway to route to it again")
    wait_for(lambda: url in healthy_workers(round_robin), 60, "round_robin to see it again")
    served = chat(round_robin, model, "after-restart")
    assert all(r.ok for r in served.results), [r.error for r in served.results]
    engine = httpx.get(url + "/v1/stats", timeout=5).json()["engine"]
    assert engine["prompt_tokens_total"] > 0  # the restarted replica served some of them


STREAMS, STREAM_TOKENS, AFTER_THE_KILL = 4, 256, 4


@dataclass
class Killed:
    name: str
    running: int  # streams on it when it was killed
    errors: list[str]  # one per stream lost
    served_after_the_kill: int

    @property
    def lost(self) -> int:
        return len(self.errors)


async def _kill_the_busier_replica(
    gateway: str, round_robin: str, model: str, replicas: dict[str, tuple[str, int]]
) -> Killed:
    """Streams through the fleet's gateway; after the kill, short requests through both."""
    async with httpx.AsyncClient(base_url=gateway, timeout=120) as client:
        started = [asyncio.Event() for _ in range(STREAMS)]
        streams = [
            asyncio.create_task(_long_stream(client, model, i, started[i])) for i in range(STREAMS)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
        running = {name: await _in_flight(client, url) for name, (url, _) in replicas.items()}
        name = max(running, key=running.__getitem__)
        os.kill(replicas[name][1], signal.SIGKILL)
        after = [
            _short_request(client, url, model, i)
            for url in (gateway, round_robin)  # round_robin sends every other one to the dead
            for i in range(AFTER_THE_KILL)
        ]
        served = sum(await asyncio.gather(*after))
        errors = [e for e in await asyncio.gather(*streams) if e is not None]
    assert sum(running.values()) == STREAMS, running
    return Killed(name, running[name], errors, served)


async def _in_flight(client: httpx.AsyncClient, replica_url: str) -> int:
    stats = (await client.get(replica_url + "/v1/stats")).json()
    return stats["server"]["in_flight"]


async def _long_stream(
    client: httpx.AsyncClient, model: str, i: int, started: asyncio.Event
) -> str | None:
    """None once the stream ends with [DONE] and no error; else what went wrong."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Story {i}: write a long tale about a river."}],
        "max_tokens": STREAM_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line.removeprefix("data: "))
                    if "error" in chunk:
                        return line
                    if any(c["delta"].get("content") for c in chunk["choices"]):
                        started.set()  # a token came back: the stream is in a replica's engine
                elif line == "data: [DONE]":
                    return None if response.status_code == 200 else str(response.status_code)
    except httpx.HTTPError as e:
        return repr(e)
    return "the stream ended without [DONE]"


async def _short_request(client: httpx.AsyncClient, gateway: str, model: str, i: int) -> bool:
    body = {"model": model, "messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 4}
    response = await client.post(gateway + "/v1/chat/completions", json=body)
    return response.status_code == 200


def _new_pid(fleet: Fleet, name: str, old: int) -> int | None:
    pid = fleet.replicas().get(name, ("", old))[1]
    return pid if pid != old else None


def test_the_dashboard_on_the_gateway_shows_each_replica(fleet: Fleet):
    from localradix.tui.feed import Snapshot
    from localradix.tui.gateway import GatewayFeed
    from localradix.tui.main import make_app
    from localradix.tui.stats import Stats
    from localradix.tui.tables import ReplicaTable

    async def first_snapshot_with_hits() -> Stats:
        """Engines publish their stats every second when idle: the request shows up soon."""
        async for event in GatewayFeed(fleet.url).events():
            if isinstance(event, Snapshot):
                stats = Stats.parse(event.data)
                if stats.routing_hit_rate is not None:
                    return stats
        raise AssertionError("the feed ended")

    wait_for(lambda: len(healthy_workers(fleet.url)) == 2, 120, "both replicas up")
    ask = {"model": model_of(fleet.url), "messages": [{"role": "user", "content": "Hi"}]}
    served = httpx.post(
        fleet.url + "/v1/chat/completions", json={**ask, "max_tokens": 1}, timeout=120
    )
    assert served.status_code == 200, served.text
    stats = asyncio.run(asyncio.wait_for(first_snapshot_with_hits(), 30))
    urls = sorted(url for url, _ in fleet.replicas().values())
    assert [r["url"] for r in stats.replicas] == urls and all(r["up"] for r in stats.replicas)
    assert stats.get("kv_total") == sum(r["kv_total"] for r in stats.replicas)

    async def dashboard_rows() -> int:
        app = make_app(fleet.url, None)
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(100):
                await pilot.pause(0.1)
                tables = [t for t in app.tables if isinstance(t, ReplicaTable)]
                if tables and tables[0].row_count:
                    assert "routing hit rate" in str(tables[0].border_title)
                    return tables[0].row_count
        return 0

    assert asyncio.run(dashboard_rows()) == 2
