"""The prefix cache's lower tiers, measured: a restart that finds an 8k-token prompt on disk,
and agents whose working set is larger than the KV pool, with and without a host-memory tier.

Runs the bundled SmolLM2-135M on the torch CPU runner (the restart also on llama.cpp with
`--backend llamacpp`), in-process (`Engine`: the same engine,
loop and graceful stop as `localradix serve`; tests/server/test_kv_disk_e2e.py covers the
HTTP path). Prints a table and writes JSON.

    python scripts/kv_tiers_bench.py [--shared 7600] [--agents 4 --agent-tokens 6000 --pool 12000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from localradix import Engine, SamplingParams  # noqa: E402
from tests.engine.conftest import bundled_gguf  # noqa: E402

FIRST = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)
ANSWER = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True, logprobs=2)
README = Path(__file__).resolve().parents[1] / "README.md"


def words(rng: np.random.Generator, n: int, vocab: int = 49152) -> list[int]:
    """`n` token ids of ordinary text-like tokens (the low ids are special and bytes)."""
    return rng.integers(300, vocab - 1, n).tolist()


def document_and_questions(
    engine: Engine, shared: int, n: int
) -> tuple[list[int], list[list[int]]]:
    """A real document (this repository's README, repeated to length) and `n` questions."""
    text = README.read_text()
    ids = engine.tokenizer.encode(text)
    while len(ids) < shared:
        ids += ids
    questions = [
        engine.tokenizer.encode(f"\n\nQuestion {i}: which command in the text above does {w}?")
        for i, w in enumerate(["serving", "pulling a model", "benchmarks", "tests", "caching",
                               "the TUI", "GPUs", "Macs", "replicas", "speculation"][:n])
    ]  # fmt: skip
    return ids[:shared], questions


def divergence(answer, reference) -> str:
    """Where two greedy answers part, and the top-two gap there (a near-tie or not)."""
    tokens, ref = answer.token_ids, reference.token_ids
    i = next((j for j, (a, b) in enumerate(zip(tokens, ref)) if a != b), None)
    if i is None:
        return "identical"
    top = dict(answer.logprobs[i].top)
    gap = top[tokens[i]] - top.get(ref[i], float("-inf"))
    return f"part at token {i}, gap {gap:.3f} nats"


def warm_up(engine: Engine) -> Engine:
    """One short unrelated request first: the first forward pays one-off setup costs."""
    engine.generate([list(range(1000, 1064))], FIRST)
    return engine


def read_all(folder: str) -> None:
    """Read every file under `folder` once (into the OS page cache)."""
    for path in Path(folder).rglob("*.kv"):
        path.read_bytes()


def ttft(engine: Engine, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the first token, and the prompt tokens found cached."""
    started = time.perf_counter()
    out = engine.generate([prompt], FIRST)[0]
    return time.perf_counter() - started, out.cached_tokens


def restart(model: str, shared: int, repeats: int, backend: str) -> dict:
    with Engine(model, backend=backend, kv_disk_cache="off", max_total_tokens=1024) as e:
        document, questions = document_and_questions(e, shared, 2 + 2 * repeats)
    disk = tempfile.mkdtemp(prefix="kv-disk-")
    # Fixed prefill chunks (no time-based step budget): every server computes the shared KV in
    # the same chunks, so answers can be compared bit for bit, not up to timing-dependent rounding
    kw = {"backend": backend, "kv_disk_gib": 4.0, "max_total_tokens": 16384, "step_budget_ms": 0}
    cold, warm, from_disk, from_cache, cached, stop_s = [], [], [], [], [], []
    versus_hit, versus_cold = [], []
    for r in range(repeats):
        asked = [questions[2 * r], questions[2 * r + 1], questions[-2]]
        with warm_up(Engine(model, kv_disk_cache="off", **kw)) as e:
            as_cold = e.generate([document + questions[-1]], ANSWER)[0]
        with warm_up(Engine(model, kv_disk_cache="off", **kw)) as e:
            for question in asked:  # what the restarted servers were asked, held in memory
                e.generate([document + question], FIRST)
            as_hit = e.generate([document + questions[-1]], ANSWER)[0]
        run_disk = f"{disk}/{r}"
        with warm_up(Engine(model, kv_disk_cache=run_disk, **kw)) as e:
            cold.append(ttft(e, document + questions[2 * r])[0])
            warm.append(ttft(e, document + questions[2 * r + 1])[0])
            started = time.perf_counter()
        stop_s.append(time.perf_counter() - started)  # the graceful stop writes the cache
        with warm_up(Engine(model, kv_disk_cache=run_disk, **kw)) as e:  # a restart
            seconds, hit = ttft(e, document + questions[-2])
            from_disk.append(seconds)
            cached.append(hit / shared)
        with warm_up(Engine(model, kv_disk_cache=run_disk, **kw)) as e:  # and another
            read_all(run_disk)  # the files in the OS page cache, as right after a stop
            from_cache.append(ttft(e, document + questions[-1])[0])
            e.flush_cache()  # the answer below comes from disk again, not from memory
            answer = e.generate([document + questions[-1]], ANSWER)[0]
        versus_hit.append(divergence(answer, as_hit))
        versus_cold.append(divergence(answer, as_cold))
    med = statistics.median
    return {
        "backend": backend,
        "shared_tokens": shared,
        "repeats": repeats,
        "cold_ttft_s": med(cold),
        "memory_hit_ttft_s": med(warm),
        "disk_hit_ttft_s": med(from_disk),
        "disk_hit_page_cached_ttft_s": med(from_cache),
        "cached_share_of_shared": min(cached),
        "graceful_stop_s": med(stop_s),
        "disk_vs_memory": med(from_disk) / med(warm),
        "page_cached_vs_memory": med(from_cache) / med(warm),
        "cold_vs_disk": med(cold) / med(from_disk),
        "answer_vs_memory_hit": versus_hit,
        "answer_vs_cold": versus_cold,
    }


def agents(model: str, n: int, tokens: int, pool: int, rounds: int, host_gib: float) -> dict:
    """`n` agents take turns on their own `tokens`-token context over a `pool`-token KV pool."""
    rng = np.random.default_rng(1)
    contexts = [words(rng, tokens) for _ in range(n)]
    hit = total = 0
    engine = Engine(
        model, backend="cpu", max_total_tokens=pool, kv_disk_cache="off", kv_host_gib=host_gib
    )
    started = time.perf_counter()
    with warm_up(engine) as e:
        for _ in range(rounds):
            for a in range(n):
                contexts[a] = contexts[a] + words(rng, 20)  # the agent's next turn
                out = e.generate([contexts[a]], FIRST)[0]
                hit += out.cached_tokens
                total += len(contexts[a])
        tiers = e.stats().kv_tiers
    return {
        "host_gib": host_gib,
        "hit_share": hit / total,
        "wall_s": time.perf_counter() - started,
        "promoted_tokens": tiers.get("promoted_tokens", 0),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=int, default=7600, help="tokens of the restarted prompt")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--agent-tokens", type=int, default=6000)
    p.add_argument("--pool", type=int, default=12000, help="KV pool tokens for the agents")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", choices=("restart", "agents"), help="run one part")
    p.add_argument(
        "--backend", default="cpu", choices=("cpu", "llamacpp"), help="the restart's backend"
    )
    p.add_argument("--json", default="kv_tiers_bench.json")
    args = p.parse_args()
    model = str(bundled_gguf())
    result: dict = {}
    if args.only != "agents":
        result["restart"] = report_restart(restart(model, args.shared, args.repeats, args.backend))
    if args.only != "restart":
        result["agents"] = report_agents(args, model)
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"(written to {args.json})")


def report_restart(r: dict) -> dict:
    print(
        f"restart on {r['backend']}, {r['shared_tokens']} shared tokens, median of {r['repeats']}:"
    )
    print(f"  cold TTFT        {r['cold_ttft_s']:8.2f} s")
    print(f"  memory-hit TTFT  {r['memory_hit_ttft_s']:8.2f} s")
    print(f"  disk-hit TTFT    {r['disk_hit_ttft_s']:8.2f} s  (after a restart)")
    print(
        f"  disk-hit TTFT    {r['disk_hit_page_cached_ttft_s']:8.2f} s  (files in the page cache)"
    )
    print(
        f"  disk / memory    {r['disk_vs_memory']:8.2f} x   cold / disk {r['cold_vs_disk']:.1f} x"
    )
    print(f"  page-cached disk / memory {r['page_cached_vs_memory']:.2f} x")
    print(
        f"  cached share     {r['cached_share_of_shared']:8.1%}   graceful stop {r['graceful_stop_s']:.2f} s"
    )
    print(f"  answer after a restart vs an in-memory hit's: {', '.join(r['answer_vs_memory_hit'])}")
    print(f"  answer after a restart vs a cold server's:    {', '.join(r['answer_vs_cold'])}")
    return r


def report_agents(args: argparse.Namespace, model: str) -> list[dict]:
    runs = [
        agents(model, args.agents, args.agent_tokens, args.pool, args.rounds, gib)
        for gib in (0.0, 1.0)
    ]
    print(f"{args.agents} agents x {args.agent_tokens} tokens over a {args.pool}-token pool, "
          f"{args.rounds} rounds:")  # fmt: skip
    for run in runs:
        label = f"host tier {run['host_gib']:g} GiB" if run["host_gib"] else "no host tier"
        print(f"  {label:18s} hit share {run['hit_share']:6.1%}   wall {run['wall_s']:7.1f} s")
    return runs


if __name__ == "__main__":
    main()
