"""Engine benchmarks on this machine (issue 3), printed as a table. Not a test: re-run anytime.

    python benchmarks/bench_engine.py [--model PATH] [--dtype auto] [--skip-transformers]

Measures, with the in-process Engine on the bundled SmolLM2-135M-Instruct by default:
single-stream decode tok/s, 32 concurrent streams aggregate tok/s, 1k-token prefill tok/s,
transformers `generate` on the same prompt, and the shared-prefix workload (32 requests sharing
a ~1.4k-token system prompt, 32 tokens out, 8 at a time) with and without the radix cache.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from localradix import Engine, SamplingParams

WORDS = (
    "cache radix tree prefix token batch schedule decode prefill memory kernel tensor model "
    "server request stream latency throughput policy evict page slot layer attention query key "
    "value head norm rotary embedding vocabulary sample temperature nucleus penalty seed"
).split()


def text_of(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, n_words))


def token_prompt(engine: Engine, n_tokens: int, seed: int) -> list[int]:
    ids = engine.tokenizer.encode(text_of(n_tokens * 2, seed))
    return ids[:n_tokens]


async def timed_stream(engine: Engine, prompt, params) -> tuple[float | None, float, int]:
    """(time to first token, time of last token, tokens) for one streamed request."""
    start = time.perf_counter()
    first, last, count = None, start, 0
    async for chunk in engine.stream(prompt, params):
        if chunk.token_ids:
            now = time.perf_counter()
            first = first if first is not None else now - start
            last, count = now, count + len(chunk.token_ids)
    return first, last, count


async def run_concurrent(engine: Engine, prompts, params, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(p):
        async with gate:
            return await timed_stream(engine, p, params)

    start = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    return time.perf_counter() - start


def bench_single_decode(engine: Engine, n: int = 128) -> float:
    params = SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)
    prompt = token_prompt(engine, 32, seed=1)
    start = time.perf_counter()
    first, last, count = asyncio.run(timed_stream(engine, prompt, params))
    assert first is not None
    return (count - 1) / (last - start - first)


def bench_concurrent(engine: Engine, streams: int = 32, n: int = 64) -> float:
    params = SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)
    prompts = [token_prompt(engine, 24, seed=100 + i) for i in range(streams)]
    wall = asyncio.run(run_concurrent(engine, prompts, params, streams))
    return streams * n / wall


def bench_prefill(engine: Engine, n_tokens: int = 1024) -> float:
    params = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)
    prompt = token_prompt(engine, n_tokens, seed=2)
    engine.generate([token_prompt(engine, 64, seed=3)], params)  # warm-up
    start = time.perf_counter()
    engine.generate([prompt], params)
    return n_tokens / (time.perf_counter() - start)


def shared_prefix_prompts(engine: Engine, n: int = 32) -> list[list[int]]:
    system = text_of(1250, seed=5)  # ~1.4k tokens with the chat template
    prompts = []
    for i in range(n):
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question {i}: {text_of(12, seed=1000 + i)}?"},
        ]
        text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompts.append(engine.tokenizer.encode(text))
    return prompts


def bench_shared_prefix(model: str | None, dtype: str, disable: bool) -> tuple[float, float, int]:
    """(wall seconds, hit rate, prompt length) of the shared-prefix workload."""
    with Engine(model, dtype=dtype, disable_radix_cache=disable, max_total_tokens=65536) as eng:
        prompts = shared_prefix_prompts(eng)
        params = SamplingParams(temperature=0, max_new_tokens=32, ignore_eos=True)
        wall = asyncio.run(run_concurrent(eng, prompts, params, concurrency=8))
        stats = eng.stats()
        hits, misses = stats.cache_hit_tokens, stats.cache_miss_tokens
        return wall, hits / max(hits + misses, 1), len(prompts[0])


def bench_transformers(engine: Engine, model_path: str, n: int = 64) -> float | None:
    """transformers greedy generate on the same prompt (fp32, same dequantized weights)."""
    import torch
    import transformers

    path = engine.core.info.path
    if path.endswith(".gguf"):
        import os

        folder, name = os.path.split(path)
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32
        )
    else:
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    hf = hf.eval()
    ids = torch.tensor([token_prompt(engine, 32, seed=1)])
    with torch.no_grad():
        hf.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        start = time.perf_counter()
        hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file or HF folder (default: bundled)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--skip-shared-prefix", action="store_true", help="speed figures only")
    args = ap.parse_args()

    def row(name: str, value: str, target: str = "") -> None:
        print(f"{name:<44}  {value:>14}  {target}", flush=True)

    with Engine(args.model, dtype=args.dtype, max_total_tokens=65536) as engine:
        info = engine.core.info
        print(f"model {info.name} ({info.architecture}), {info.device}, {info.dtype}")
        bench_single_decode(engine, 8)  # warm-up
        row("single-stream decode", f"{bench_single_decode(engine):.1f} tok/s", ">= 13")
        row("32 streams aggregate", f"{bench_concurrent(engine):.1f} tok/s", ">= 135")
        row("prefill 1k tokens", f"{bench_prefill(engine):.1f} tok/s", ">= 250")
        if not args.skip_transformers:
            tf = bench_transformers(engine, info.path)
            row("transformers generate (bs=1, same prompt)", f"{tf:.1f} tok/s", "reference")
    if args.skip_shared_prefix:
        return
    cached_wall, hit_rate, plen = bench_shared_prefix(args.model, args.dtype, disable=False)
    row(f"shared prefix ({plen}-token prompts), cache", f"{cached_wall:.1f} s")
    plain_wall, _, _ = bench_shared_prefix(args.model, args.dtype, disable=True)
    row("shared prefix, --disable-radix-cache", f"{plain_wall:.1f} s")
    row("shared prefix speed-up", f"{plain_wall / cached_wall:.1f}x", ">= 5x")
    row("shared prefix hit rate", f"{hit_rate:.3f}", ">= 0.9")


if __name__ == "__main__":
    main()
