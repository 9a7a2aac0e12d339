"""Measure what the stats feed costs (not a test; run by hand, takes minutes on a CPU):

    python tests/tui/measure_stats_feed.py engine   # EngineStats snapshot cost, in-process
    python tests/tui/measure_stats_feed.py server   # agent bench with 0 vs N feed clients

`engine`: the engine process builds one EngineStats every 0.2 s while busy (1 s idle) and pickles
it to the API process whatever the number of dashboards; this times `core.stats()` + pickle
with the radix tree holding the agent workload, then with a few hundred cached prompts.
`server`: runs the `agent` benchmark against one server alternately with no stats clients and
with N SSE clients (each one a dashboard) plus one 20 Hz poller of /v1/stats, and reports
throughput and the CPU seconds of the API and engine processes; it also attaches the real
dashboard during the loaded runs and prints its screen at the busiest moment and at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]


def time_stats(core, n: int = 300) -> dict:
    wall, cpu, pick = [], [], []
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.process_time()
        stats = core.stats()
        w1 = time.perf_counter()
        blob = pickle.dumps(stats)
        w2, c2 = time.perf_counter(), time.process_time()
        wall.append(w1 - w0)
        pick.append(w2 - w1)
        cpu.append(c2 - c0)
    return {
        "stats_ms_median": 1e3 * statistics.median(wall),
        "pickle_ms_median": 1e3 * statistics.median(pick),
        "cpu_ms_mean": 1e3 * statistics.fmean(cpu),
        "pickle_bytes": len(blob),
        "busy_share_at_5hz": statistics.fmean(cpu) * 5,
        "nodes": sum(1 for _ in core.scheduler.cache.iter_nodes()),
    }


def engine_cost() -> None:
    from localradix import Engine, SamplingParams
    from localradix.bench.workloads import Sizes, build_workload

    work = build_workload("agent", Sizes(), seed=0)
    with Engine(max_total_tokens=65536) as engine:
        chats = [
            [{"role": "system", "content": s.system}, {"role": "user", "content": s.turns[0]}]
            for s in work.sessions
        ]
        prompts = [
            engine.tokenizer.encode(
                engine.tokenizer.apply_chat_template(c, add_generation_prompt=True),
                add_special_tokens=False,
            )
            for c in chats
        ]
        t0 = time.perf_counter()
        engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0))
        gen_s = time.perf_counter() - t0
        print(f"agent workload ({len(prompts)} requests, 8 tokens each): {gen_s:.1f} s")
        print("after agent:", json.dumps(time_stats(engine.core)))
        extra = [[7000 + i, *range(i * 50 + 1, i * 50 + 60)] for i in range(400)]
        engine.generate(extra, SamplingParams(max_new_tokens=1, temperature=0))
        print("+400 prompts:", json.dumps(time_stats(engine.core)))


async def hammer(
    url: str, clients: int, stop: asyncio.Event, counts: dict, poll: bool = True
) -> None:
    import httpx

    from localradix.tui.feed import HttpFeed, Snapshot

    async def sse() -> None:
        async for event in HttpFeed(url).events():
            counts["sse"] += isinstance(event, Snapshot)
            if stop.is_set():
                return

    async def poller() -> None:
        async with httpx.AsyncClient(base_url=url, trust_env=False) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                await c.get("/v1/stats")
                counts["poll_ms"].append(1e3 * (time.perf_counter() - t0))
                await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(sse()) for _ in range(clients)]
    tasks += [asyncio.create_task(poller())] if poll else []
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def cpu_seconds(proc) -> dict:
    import psutil

    api = psutil.Process(proc.pid)
    kids = api.children(recursive=True)
    engine = max(kids, key=lambda p: p.cpu_times().user, default=None)
    t = api.cpu_times()
    e = engine.cpu_times() if engine else None
    return {"api": t.user + t.system, "engine": (e.user + e.system) if e else 0.0}


async def bench_once(url: str, scale: float, out: Path) -> dict:
    cmd = [sys.executable, "-m", "localradix", "bench", "--url", url, "--workload", "agent",
           "--scale", str(scale), "--no-progress", "--output", str(out)]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(err.decode()[-2000:])
    data = json.loads(out.read_text())
    run = data["runs"][0] if "runs" in data else data
    return {
        "wall_s": run["wall_time_s"],
        "out_tok_s": run["output_tokens_per_s"],
        "ttft_p50": run["ttft_s"]["p50"],
        "cached_share": run["cached_share"],
    }


async def wait_healthy(url: str) -> None:
    import httpx

    async with httpx.AsyncClient(trust_env=False) as c:
        for _ in range(2400):
            try:
                if (await c.get(url + "/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError("server not healthy")


async def idle_api_cost(server, clients: int, seconds: float) -> dict:
    """API-process CPU per second of wall time, engine idle, with `clients` SSE dashboards
    (+ one 20 Hz poller when clients > 1)."""
    stop, counts = asyncio.Event(), {"sse": 0, "poll_ms": []}
    task = None
    if clients:
        task = asyncio.create_task(hammer(server.url, clients, stop, counts, poll=clients > 1))
    await asyncio.sleep(1.0)
    cpu0, t0 = cpu_seconds(server.process.proc), time.perf_counter()
    await asyncio.sleep(seconds)
    cpu1, wall = cpu_seconds(server.process.proc), time.perf_counter() - t0
    stop.set()
    if task:
        await task
    return {
        "clients": clients,
        "api_cpu_per_s": round((cpu1["api"] - cpu0["api"]) / wall, 4),
        "engine_cpu_per_s": round((cpu1["engine"] - cpu0["engine"]) / wall, 4),
        "snapshots_per_s": round(counts["sse"] / (wall + 1.0), 1),
        "poll_ms_p50": round(statistics.median(counts["poll_ms"]), 2)
        if counts["poll_ms"]
        else None,
    }


async def loaded_run(server, scale: float, clients: int, out: Path, shot: Path | None) -> dict:
    from tui_fakes import screen_text

    from localradix.tui.main import make_app

    stop, counts = asyncio.Event(), {"sse": 0, "poll_ms": []}
    cpu0, t0 = cpu_seconds(server.process.proc), time.perf_counter()
    hammering = asyncio.create_task(hammer(server.url, clients, stop, counts)) if clients else None
    if shot is None:
        res = await bench_once(server.url, scale, out)
    else:
        app = make_app(server.url, None, server=server)
        async with app.run_test(size=(80, 24)) as pilot:
            bench = asyncio.create_task(bench_once(server.url, scale, out))
            busiest, busiest_text = -1.0, ""
            while not bench.done():
                await pilot.pause(0.5)
                load = (app.stats.get("running") or 0) + (app.stats.get("queued") or 0) / 100
                if load > busiest:
                    busiest, busiest_text = load, screen_text(app)
            await pilot.pause(2.0)
            print("\n--- dashboard at the busiest moment ---\n" + busiest_text)
            print("--- dashboard after the run ---\n" + screen_text(app), flush=True)
            app.save_screenshot(str(shot))
            res = bench.result()
    stop.set()
    if hammering:
        await hammering
    cpu1, wall = cpu_seconds(server.process.proc), time.perf_counter() - t0
    res["api_cpu_s"] = round(cpu1["api"] - cpu0["api"], 2)
    res["engine_cpu_s"] = round(cpu1["engine"] - cpu0["engine"], 2)
    res["run_wall_s"] = round(wall, 1)
    res["clients"] = clients + (shot is not None)
    return res


async def server_cost(rounds: int, clients: int, scale: float, idle_s: float) -> None:
    from localradix.tui.main import start_server

    server = start_server(argparse.Namespace(model=None, max_total_tokens=65536))
    tmp = Path(tempfile.mkdtemp())
    try:
        await wait_healthy(server.url)
        for n in (0, 1, clients):
            print("idle", json.dumps(await idle_api_cost(server, n, idle_s)), flush=True)
        for r in range(rounds):
            base = await loaded_run(server, scale, 0, tmp / f"{r}-none.json", None)
            print("bench, no feed clients", json.dumps(base), flush=True)
            fed = await loaded_run(server, scale, clients, tmp / f"{r}.json", tmp / "tui.svg")
            print(f"bench, TUI + {clients} SSE clients + 20 Hz poller", json.dumps(fed), flush=True)
        print(f"(SVG of the dashboard: {tmp / 'tui.svg'})")
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("engine", "server"))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--scale", type=float, default=0.25)
    p.add_argument("--idle-seconds", type=float, default=20.0)
    a = p.parse_args()
    if a.what == "engine":
        engine_cost()
    else:
        asyncio.run(server_cost(a.rounds, a.clients, a.scale, a.idle_seconds))


if __name__ == "__main__":
    main()
