"""Replicas behind the smg gateway (issue 20): how much of the prompt the replicas' radix caches
serve when smg routes by cache affinity, against one server alone and against round robin.

    python benchmarks/bench_replicas.py [--replicas 2] [--model PATH] [--scale 0.5]
                                        [--workloads agent chat] [-- SERVER ARGS...]

Starts `localradix serve --replicas N` (the fleet, smg cache_aware in front) and a second smg
over the same replicas with --policy round_robin, then runs each workload of
`localradix bench` three times: against replica 0 alone (the single-server figure), through
the cache_aware gateway and through the round_robin one. Every run opens its prompts with its
own nonce, so no run reuses another's cache. Printed per run: requests (ok), the cached share
of prompt tokens (the gateway-side `cached_tokens` over `prompt_tokens`), wall time and
requests per second.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import httpx

from localradix.bench.runner import Endpoint, RunOptions, RunResult, run_workload
from localradix.bench.workloads import Sizes, build_workload
from localradix.child_server import ServerProcess, free_port, localradix_env
from localradix.config import ServerArgs
from localradix.fleet.gateway import gateway_argv


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--model", default=None, help="default: the bundled model")
    p.add_argument("--scale", type=float, default=0.5, help="workload size (bench --scale)")
    p.add_argument("--workloads", nargs="+", default=["agent", "chat"])
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("server_args", nargs=argparse.REMAINDER, help="after --: for each replica")
    return p.parse_args()


def start_fleet(ns: argparse.Namespace) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, "-m", "localradix", "serve", *([ns.model] if ns.model else [])]
    argv += ["--replicas", str(ns.replicas), "--port", str(port)]
    argv += [a for a in ns.server_args if a != "--"]
    fleet = ServerProcess(argv, port, ready_timeout=900, env=localradix_env())
    fleet.__enter__()
    return fleet


def workers(gateway: str, count: int) -> list[str]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = httpx.get(gateway + "/workers", timeout=5).json()["workers"]
        healthy = sorted(w["url"] for w in listed if w.get("is_healthy"))
        if len(healthy) == count:
            return healthy
        time.sleep(0.5)
    raise SystemExit(f"the gateway at {gateway} never listed {count} healthy workers")


def start_round_robin(urls: list[str]) -> ServerProcess:
    port = free_port()
    args = ServerArgs(port=port, router_policy="round_robin", log_level="warning")
    gateway = ServerProcess(gateway_argv(args, urls, free_port()), port, env=localradix_env())
    gateway.__enter__()
    workers(gateway.base, len(urls))
    return gateway


def run(url: str, workload_name: str, ns: argparse.Namespace, nonce: str) -> RunResult:
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    workload = build_workload(workload_name, Sizes(scale=ns.scale), nonce=nonce)
    opts = RunOptions(concurrency=ns.concurrency, warmup=0, progress=False)
    return asyncio.run(run_workload(Endpoint(url + "/v1", model), workload, opts))


def row(workload: str, target: str, result: RunResult) -> str:
    ok = [r for r in result.results if r.ok]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    share = f"{cached / prompt:6.1%}" if prompt else "     –"
    rps = len(ok) / result.wall_time if result.wall_time else 0.0
    total = len(result.results)
    return (
        f"{workload:<7} {target:<22} {len(ok):>3}/{total:<3} {share:>8} "
        f"{result.wall_time:>7.1f} {rps:>6.2f}"
    )


def main() -> int:
    ns = parse_args()
    fleet = start_fleet(ns)
    round_robin = None
    try:
        urls = workers(fleet.base, ns.replicas)
        round_robin = start_round_robin(urls)
        targets = {
            "single server": urls[0],
            f"{ns.replicas} x cache_aware": fleet.base,
            f"{ns.replicas} x round_robin": round_robin.base,
        }
        print(f"{'load':<7} {'target':<22} {'ok':>7} {'cached':>8} {'wall s':>7} {'req/s':>6}")
        for name in ns.workloads:
            for i, (target, url) in enumerate(targets.items()):
                result = run(url, name, ns, nonce=f"{name}-{i}-{time.time_ns()}")
                print(row(name, target, result), flush=True)
    finally:
        if round_robin is not None:
            round_robin.stop()
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
