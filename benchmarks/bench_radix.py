"""Micro-benchmark of the radix cache (a script, not a timed test).

Targets (issue 2), on a 2-core machine:
- `match_prefix` of a 32k-token prompt against a tree holding 1M tokens: <= 5 ms;
- `insert` of a 4k-token request: <= 2 ms.

The tree is shaped like chat traffic: a few system prompts, multi-turn conversations that fork
at turn boundaries (edits, regenerations), and one 32k-token conversation forked at many turns,
so the probe walks dozens of nodes and splits one. A stress probe follows a 32k path forked
every 64 tokens (~500 nodes). Insert times 4k-token requests that share 1-3k tokens with a
cached chat and diverge inside a node (walk, split, new leaf). Every timed call uses a fresh
probe or request, so no run repeats a previous one. Keys are int64 arrays, as the engine passes
them; the list-input figure adds the Python-list conversion. Exit status 1 if a target is missed.

Run: python benchmarks/bench_radix.py [--runs 31] [--tokens 1000000] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from localradix.mem import KVPool, RadixCache, check_invariants

VOCAB = 32_000
MATCH_TARGET_MS = 5.0
INSERT_TARGET_MS = 2.0


def cache_request(cache: RadixCache, key: np.ndarray) -> None:
    """What the scheduler does when a request finishes: match, allocate, insert, free dups."""
    match = cache.match_prefix(key)
    own = cache.pool.alloc(len(key) - match.matched_len)
    assert own is not None, "benchmark pool too small"
    slots = np.concatenate([match.indices, own])
    already = cache.insert(key, slots)
    cache.pool.free(slots[match.matched_len : already])


def build_tree(
    cache: RadixCache, tokens: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Fill the cache with chat-like traffic; return the long chats the probes follow."""
    systems = [rng.integers(0, VOCAB, rng.integers(500, 3000)) for _ in range(8)]
    long_turns = [rng.integers(0, VOCAB, 500) for _ in range(66)]
    long_chat = np.concatenate([systems[0], *long_turns])
    cache_request(cache, long_chat)
    for cut in range(1, 66, 2):  # forks of the long chat at every other turn
        fork = np.concatenate([systems[0], *long_turns[:cut], rng.integers(0, VOCAB, 300)])
        cache_request(cache, fork)
    deep_chat = rng.integers(0, VOCAB, 33_000)
    cache_request(cache, deep_chat)
    for cut in range(64, 33_000, 64):  # stress: a fork every 64 tokens
        cache_request(cache, np.concatenate([deep_chat[:cut], rng.integers(0, VOCAB, 64)]))
    chats: list[np.ndarray] = []
    while cache.total_size < tokens:
        chats.append(next_chat(chats, systems, rng))
        cache_request(cache, chats[-1])
    return long_chat, deep_chat


def next_chat(chats: list[np.ndarray], systems: list[np.ndarray], rng: np.random.Generator):
    """A new conversation, or a fork of an old one extended by a few new turns."""
    if chats and rng.random() < 0.5:
        old = chats[rng.integers(len(chats))]
        base = old[: rng.integers(len(old) // 2, len(old))]
    else:
        base = systems[rng.integers(len(systems))]
    turns = [rng.integers(0, VOCAB, rng.integers(100, 1500)) for _ in range(rng.integers(1, 6))]
    return np.concatenate([base, *turns])


def median_ms(fn: Callable[[int], object], runs: int) -> float:
    times = []
    for i in range(runs):
        start = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def bench_match(cache: RadixCache, long_chat: np.ndarray, runs: int, as_list: bool) -> float:
    rng = np.random.default_rng(1 + as_list)
    cuts = rng.integers(30_000, 32_000, runs)  # fresh divergence point: a split every run
    probes = [np.concatenate([long_chat[:c], rng.integers(0, VOCAB, 32_768 - c)]) for c in cuts]
    keys = [p.tolist() for p in probes] if as_list else probes
    matched = [0]

    def run(i: int) -> None:
        matched[0] = cache.match_prefix(keys[i]).matched_len

    ms = median_ms(run, runs)
    assert matched[0] >= 30_000, "the probe should follow the long conversation"
    return ms


def bench_insert(cache: RadixCache, long_chat: np.ndarray, runs: int) -> float:
    """4k-token requests that share 1-3k tokens with the long chat and diverge mid-node."""
    rng = np.random.default_rng(3)
    cuts = rng.integers(1_000, 3_000, runs)
    keys = [np.concatenate([long_chat[:c], rng.integers(0, VOCAB, 4_096 - c)]) for c in cuts]
    slots = [cache.pool.alloc(4_096) for _ in keys]
    already = [0] * runs

    def run(i: int) -> None:
        already[i] = cache.insert(keys[i], slots[i])  # type: ignore[arg-type]

    ms = median_ms(run, runs)
    for own, n in zip(slots, already, strict=True):
        assert own is not None and n >= 1_000
        cache.pool.free(own[:n])  # the caller's duplicates of the cached prefix
    return ms


def path_nodes(cache: RadixCache, key: np.ndarray) -> int:
    node, n = cache.match_prefix(key).last_node, 0
    while node is not cache.root:
        node, n = node.parent, n + 1  # type: ignore[assignment]
    return n


def report(name: str, ms: float, target: float | None) -> None:
    verdict = "" if target is None else ("  MET" if ms <= target else "  MISSED")
    limit = "" if target is None else f" (target <= {target:.1f} ms)"
    print(f"{name:<48} {ms:7.3f} ms{limit}{verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=31)
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    pool = KVPool(args.tokens + 400_000)
    cache = RadixCache(pool)
    start = time.perf_counter()
    long_chat, deep_chat = build_tree(cache, args.tokens, rng)
    nodes = sum(1 for _ in cache.iter_nodes())
    print(
        f"tree: {cache.total_size:,} tokens in {nodes:,} nodes, built in "
        f"{time.perf_counter() - start:.1f} s; median of {args.runs} runs each"
    )
    print(f"the 32k probe walks {path_nodes(cache, long_chat[:32_000])} nodes")
    match_ms = bench_match(cache, long_chat, args.runs, as_list=False)
    report("match_prefix, 32k-token prompt (int64 array)", match_ms, MATCH_TARGET_MS)
    list_ms = bench_match(cache, long_chat, args.runs, as_list=True)
    report("match_prefix, 32k-token prompt (Python list)", list_ms, None)
    deep = path_nodes(cache, deep_chat[:32_000])
    deep_ms = bench_match(cache, deep_chat, args.runs, as_list=False)
    report(f"match_prefix, 32k prompt, stress: {deep}-node path", deep_ms, MATCH_TARGET_MS)
    insert_ms = bench_insert(cache, long_chat, args.runs)
    report("insert, 4k-token request (1-3k cached, split)", insert_ms, INSERT_TARGET_MS)
    report(
        "evict 4k tokens (LRU heap over all leaves)",
        median_ms(lambda _: cache.evict(4_096), args.runs),
        None,
    )
    check_ms = median_ms(lambda _: check_invariants(pool, cache, idle=True), 3)
    report("check_invariants (idle-time check), whole tree", check_ms, None)
    met = max(match_ms, deep_ms) <= MATCH_TARGET_MS and insert_ms <= INSERT_TARGET_MS
    print("targets met" if met else "targets MISSED")
    raise SystemExit(0 if met else 1)


if __name__ == "__main__":
    main()
