"""Overhead of the HTTP path (`localradix serve`) against the in-process `Engine` (issue 4).

    python benchmarks/bench_http_overhead.py [--model PATH] [--rounds 3] [--no-stream]

The shared-prefix workload of benchmarks/bench_engine.py: 32 requests sharing a ~1.4k-token
system prompt, each with its own question, 32 tokens out (greedy, EOS ignored), 8 at a time.
The same prompts run through `Engine.stream` in this process and through
`POST /v1/completions` (SSE) on a `localradix serve` subprocess with the same settings; rounds
alternate between the two (cache flushed before each) to share the machine's noise, and the
median wall times are compared. Overhead = HTTP wall / in-process wall - 1 (target <= 15%).

On a shared or small machine wall time is dominated by other tenants, so the CPU seconds spent
by the HTTP path itself (the API process plus this client) are reported too, as a share of the
engine process's CPU seconds: that part is what the HTTP path costs, whatever the noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import httpx
import numpy as np
import psutil

from localradix import Engine, SamplingParams
from localradix.child_server import ServerProcess, free_port, localradix_argv, localradix_env

WORDS = (
    "cache radix tree prefix token batch schedule decode prefill memory kernel tensor model "
    "server request stream latency throughput policy evict page slot layer attention query key "
    "value head norm rotary embedding vocabulary sample temperature nucleus penalty seed"
).split()


def workload(n_requests: int, prefix_words: int) -> list[str]:
    rng = np.random.default_rng(0)
    system = "You are a careful assistant. Context: " + " ".join(rng.choice(WORDS, prefix_words))
    return [
        f"{system}\nQuestion {i}: {' '.join(rng.choice(WORDS, 12))}?" for i in range(n_requests)
    ]


# ---- in-process ------------------------------------------------------------------------------


async def engine_round(engine: Engine, prompts: list[str], max_tokens: int, conc: int) -> dict:
    params = SamplingParams(temperature=0, max_new_tokens=max_tokens, ignore_eos=True)
    gate = asyncio.Semaphore(conc)

    async def one(prompt: str) -> tuple[float, int]:
        async with gate:
            start, first, count = time.perf_counter(), None, 0
            async for chunk in engine.stream(prompt, params):
                if chunk.token_ids:
                    first = first if first is not None else time.perf_counter() - start
                    count += len(chunk.token_ids)
            return first or 0.0, count

    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    return _summary(time.perf_counter() - start, results)


# ---- over HTTP -------------------------------------------------------------------------------


async def http_round(
    url: str, prompts: list[str], max_tokens: int, conc: int, stream: bool
) -> dict:
    gate = asyncio.Semaphore(conc)
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(prompt: str) -> tuple[float, int]:
            body = {
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": stream,
                "stream_options": {"include_usage": True},
            }
            async with gate:
                start = time.perf_counter()
                if not stream:
                    r = await client.post("/v1/completions", json=body)
                    r.raise_for_status()
                    return 0.0, r.json()["usage"]["completion_tokens"]
                first, count = None, 0
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    r.raise_for_status()
                    async for line in r.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        event = json.loads(line[6:])
                        if event["choices"] and first is None:
                            first = time.perf_counter() - start
                        if event.get("usage"):
                            count = event["usage"]["completion_tokens"]
                return first or 0.0, count

        start = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts))
        return _summary(time.perf_counter() - start, results)


def _summary(wall: float, results: list[tuple[float, int]]) -> dict:
    tokens = sum(count for _, count in results)
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tok_per_s": tokens / wall,
        "mean_ttft_s": statistics.mean(first for first, _ in results),
    }


def launch_server(args: argparse.Namespace) -> ServerProcess:
    """`localradix serve` with the in-process engine's settings; entered = answering /health."""
    port = free_port()
    flags = ("--max-total-tokens", str(args.max_total_tokens), "--dtype", args.dtype)
    argv = localradix_argv((*flags, "--log-level", "warning"), port, args.model)
    return ServerProcess(argv, port, env=localradix_env())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--prefix-words", type=int, default=1400)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="auto", help="the same for both paths")
    p.add_argument("--no-stream", action="store_true", help="non-streaming HTTP requests")
    args = p.parse_args()

    prompts = workload(args.requests, args.prefix_words)
    engine = Engine(args.model, max_total_tokens=args.max_total_tokens, dtype=args.dtype)
    print(f"shared prefix: {len(engine.tokenizer.encode(prompts[0]))} tokens per prompt")
    try:
        with launch_server(args) as server:
            rows, cpu = measure(engine, server, prompts, args)
    finally:
        engine.close()

    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in rows.items()}
    print()
    print(f"{'path':<12}{'median wall s':>15}{'tok/s':>10}{'mean TTFT s':>14}")
    for name, runs in rows.items():
        tps = statistics.median(r["tok_per_s"] for r in runs)
        ttft = statistics.median(r["mean_ttft_s"] for r in runs)
        print(f"{name:<12}{med[name]:>15.2f}{tps:>10.1f}{ttft:>14.3f}")
    overhead = med["http"] / med["in-process"] - 1
    mode = "non-streaming" if args.no_stream else "SSE"
    print(f"\nHTTP ({mode}) overhead vs in-process Engine: {overhead:+.1%} (target <= 15%)")
    share = (cpu["api"] + cpu["client"]) / max(cpu["engine"], 1e-9)
    print(
        f"CPU seconds over the HTTP rounds: API process {cpu['api']:.1f}, client "
        f"{cpu['client']:.1f}, engine process {cpu['engine']:.1f} -> the HTTP path costs "
        f"{share:.1%} of the engine's CPU time"
    )
    return 0


def measure(
    engine: Engine, server: ServerProcess, prompts: list[str], args: argparse.Namespace
) -> tuple[dict[str, list[dict]], dict[str, float]]:
    """Alternating rounds (cache flushed before each), and the CPU seconds of the HTTP rounds."""
    url = server.base
    served = httpx.get(url + "/v1/stats").json()["model"]
    print(f"dtype: in-process {engine.core.info.dtype}, server {served['dtype']}")
    stream = not args.no_stream
    run_e = lambda: asyncio.run(  # noqa: E731
        engine_round(engine, prompts, args.max_tokens, args.concurrency)
    )
    run_h = lambda: asyncio.run(  # noqa: E731
        http_round(url, prompts, args.max_tokens, args.concurrency, stream)
    )
    assert server.proc is not None
    api = psutil.Process(server.proc.pid)
    engine_proc = next(c for c in api.children() if "spawn_main" in " ".join(c.cmdline()))
    me = psutil.Process()
    cpu = {"api": 0.0, "client": 0.0, "engine": 0.0}
    run_e(), run_h()  # warm-up (allocations, first-call costs)
    rows: dict[str, list[dict]] = {"in-process": [], "http": []}
    for i in range(args.rounds):
        engine.flush_cache()
        rows["in-process"].append(run_e())
        httpx.post(url + "/v1/cache/flush").raise_for_status()
        before = [_cpu(p) for p in (api, me, engine_proc)]
        rows["http"].append(run_h())
        for key, b, p in zip(cpu, before, (api, me, engine_proc), strict=True):
            cpu[key] += _cpu(p) - b
        print(
            f"round {i + 1}: in-process {rows['in-process'][-1]['wall_s']:.2f} s, "
            f"http {rows['http'][-1]['wall_s']:.2f} s"
        )
    return rows, cpu


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    sys.exit(main())
