"""`localradix serve --replicas 2` behind smg, end to end on the bundled model (real processes).

One fleet per module. The same chat workload (4 conversations x 3 turns, max_tokens 8) runs
against one replica alone (the single-server baseline), through the fleet's own gateway
(cache_aware) and through a second smg gateway over the same replicas (round_robin); each run
opens its prompts with its own nonce, so no run reuses another's cache. Then one replica is
killed mid-run: only requests in flight on it may fail, the supervisor restarts it and the
gateway routes to it again.
"""

from __future__ import annotations

import asyncio
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

from localradix.bench.launch import free_port
from localradix.bench.runner import SKIPPED, Endpoint, RunOptions, RunResult, run_workload
from localradix.bench.workloads import Sizes, build_workload
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
    replicas = fleet.replicas()
    model = model_of(fleet.url)
    killed: list[tuple[str, str, int, int, float]] = []  # name, url, pid, in flight, when

    async def run_and_kill() -> RunResult:
        run = asyncio.create_task(asyncio.to_thread(chat, fleet.url, model, "kill"))
        async with httpx.AsyncClient(timeout=5) as client:
            while not run.done() and not killed:  # kill whichever replica works first
                for name, (url, pid) in replicas.items():
                    busy = (await client.get(url + "/v1/stats")).json()["server"]["in_flight"]
                    if busy:
                        os.kill(pid, signal.SIGKILL)
                        killed.append((name, url, pid, busy, time.perf_counter()))
                        break
                await asyncio.sleep(0.02)
        return await run

    run = asyncio.run(run_and_kill())
    assert killed, "the run ended before a replica had a request"
    name, url, pid, busy, killed_at = killed[0]
    lost = [r for r in run.results if not r.ok and r.error != SKIPPED]
    print(f"\nkilled {name} with {busy} requests on it: {len(lost)} lost, {_skipped(run)} skipped")
    assert len(lost) <= busy, [r.error for r in lost]
    assert all(r.start < killed_at for r in lost)  # every request sent afterwards succeeded

    new_pid = wait_for(lambda: _new_pid(fleet, name, pid), 120, "the supervisor's restart")
    assert new_pid != pid and not _alive(pid)
    wait_for(lambda: url in healthy_workers(fleet.url), 60, "the gateway to route to it again")
    wait_for(lambda: url in healthy_workers(round_robin), 60, "round_robin to see it again")
    served = chat(round_robin, model, "after-restart")
    assert all(r.ok for r in served.results), [r.error for r in served.results]
    engine = httpx.get(url + "/v1/stats", timeout=5).json()["engine"]
    assert engine["prompt_tokens_total"] > 0  # the restarted replica served some of them


def _skipped(run: RunResult) -> int:
    return sum(r.error == SKIPPED for r in run.results)


def _new_pid(fleet: Fleet, name: str, old: int) -> int | None:
    pid = fleet.replicas().get(name, ("", old))[1]
    return pid if pid != old else None


def test_the_dashboard_on_the_gateway_shows_each_replica(fleet: Fleet):
    from localradix.tui.feed import Snapshot
    from localradix.tui.gateway import GatewayFeed
    from localradix.tui.main import make_app
    from localradix.tui.stats import Stats
    from localradix.tui.tables import ReplicaTable

    async def first_snapshot() -> Stats:
        async for event in GatewayFeed(fleet.url).events():
            if isinstance(event, Snapshot):
                return Stats.parse(event.data)
        raise AssertionError("the feed ended")

    stats = asyncio.run(first_snapshot())
    urls = sorted(url for url, _ in fleet.replicas().values())
    assert [r["url"] for r in stats.replicas] == urls and all(r["up"] for r in stats.replicas)
    assert stats.get("kv_total") == sum(r["kv_total"] for r in stats.replicas)
    assert stats.routing_hit_rate is not None  # the earlier tests sent shared prefixes

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
