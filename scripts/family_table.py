"""Family x backend table (issue 32): for a random-weight model of each family the torch backend
serves, on each backend that serves it here: greedy parity with transformers, a cache hit,
prefill and decode tokens/s, through the in-process `localradix.Engine`.

Models come from scripts/family_models.py ("tiny": seconds; "100m": about 100M parameters, the
table gives the real count). Backends: `cpu` (torch eager), `mlx` (MLX, here its CPU build) and
`llamacpp`, which serves the same config with a tokenizer llama.cpp's converter knows (so its
own vocabulary and parameter count), converted to an f32 GGUF, each row in a child process (a
ggml assert aborts). A backend that refuses a family gets the row "refused: <reason>". All in
float32, on the engine's default settings.

- parity: the greedy tokens of a short prompt equal transformers' own (eager, fp32) argmax loop.
- cache hit: a follow-up turn (the first turn's prompt + answer + more) reports cached tokens and
  gives the tokens it gives with the cache flushed.
- prefill tok/s: a fresh random prompt (512 tokens at 100m) with one new token, over its time.
- decode tok/s: batch 1, the tokens after the first over the time between first and last
  (64 new at 100m), streamed.
Timings are medians of --repeats runs, after a short warm-up of each path. Progress goes to
stderr, the markdown table to stdout.

    python scripts/family_table.py --scale 100m --out family_table.json
    python scripts/family_table.py --scale tiny --families llama,mixtral --backends cpu
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
from family_models import FAMILIES, SCALES, build, build_gguf  # noqa: E402

from localradix import Engine, SamplingParams  # noqa: E402

BACKENDS = ("cpu", "mlx", "llamacpp")
FIRST_ID = 3  # ids below are the tokenizer's specials (pad, EOS, BOS)


@dataclass(frozen=True)
class Sizes:
    """Token counts of each measurement at a scale."""

    parity_prompt: int
    parity_new: int
    prefill: int
    decode: int


SIZES = {"tiny": Sizes(12, 8, 128, 16), "100m": Sizes(16, 16, 512, 64)}


@dataclass
class Row:
    family: str
    params: int
    backend: str
    parity: str  # "yes" | "no: ..." | "refused: <reason>" | "error: ..."
    cache_hit: str = ""  # "yes (N cached)" | "no: ..."
    prefill_tps: float | None = None
    decode_tps: float | None = None
    seconds: float = 0.0  # wall time of this row (engine start included)
    distinct: int = 0  # distinct tokens in transformers' answer (parity of a varied answer)


def log(message: str) -> None:
    print(f"[family_table] {message}", file=sys.stderr, flush=True)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """transformers' own greedy tokens: a plain argmax loop over its KV cache (as the tests'
    reference; `generate` would mask EOS)."""
    import inspect

    import torch

    # transformers 5 renamed `past_key_values` to `cache`
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids, out, past = torch.tensor([prompt]), [], None
    with torch.no_grad():
        for _ in range(n):
            result = model(ids, use_cache=True, **{name: past})
            past = getattr(result, name)
            out.append(int(result.logits[0, -1].argmax()))
            ids = torch.tensor([[out[-1]]])
    return out


class Prompts:
    """Random token ids, never twice the same (no cache hit where none is meant)."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.rng, self.vocab = np.random.default_rng(seed), vocab

    def __call__(self, n: int) -> list[int]:
        return self.rng.integers(FIRST_ID, self.vocab, n).tolist()


def check_parity(engine: Engine, reference: list[int], prompt: list[int]) -> str:
    got = engine.generate([prompt], greedy(len(reference)))[0].token_ids
    if got == reference:
        return "yes"
    pairs = enumerate(zip(got, reference, strict=False))
    first = next((i for i, (a, b) in pairs if a != b), min(len(got), len(reference)))
    return f"no: differs from token {first}"


def check_cache_hit(engine: Engine, prompts: Prompts, sizes: Sizes) -> str:
    """A second turn (first prompt + its answer + a new message): cached tokens > 0 and the
    same tokens as with the cache flushed."""
    first = prompts(sizes.parity_prompt * 2)
    answer = engine.generate([first], greedy(sizes.parity_new))[0].token_ids
    second = first + answer + prompts(sizes.parity_prompt)
    warm = engine.generate([second], greedy(sizes.parity_new))[0]
    engine.flush_cache()
    cold = engine.generate([second], greedy(sizes.parity_new))[0]
    if warm.cached_tokens <= 0:
        return "no: 0 cached tokens"
    if warm.token_ids != cold.token_ids:
        return f"no: {warm.cached_tokens} cached, tokens differ from cold"
    return f"yes ({warm.cached_tokens} cached)"


def prefill_rate(engine: Engine, prompt: list[int]) -> float:
    engine.flush_cache()
    start = time.perf_counter()
    engine.generate([prompt], greedy(1))
    return len(prompt) / (time.perf_counter() - start)


def decode_rate(engine: Engine, prompt: list[int], n: int) -> float:
    """Tokens after the first, over the time from the first to the last (batch 1)."""

    async def marks() -> list[tuple[float, int]]:
        out = []
        async for chunk in engine.stream(prompt, greedy(n)):
            out.append((time.perf_counter(), len(chunk.token_ids)))
        return out

    engine.flush_cache()
    seen = [m for m in asyncio.run(marks()) if m[1]]
    if sum(k for _, k in seen) != n or len(seen) < 2:
        raise RuntimeError(f"streamed {sum(k for _, k in seen)} tokens in {len(seen)} chunks")
    return sum(k for _, k in seen[1:]) / (seen[-1][0] - seen[0][0])


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


@dataclass(frozen=True)
class Served:
    """What one backend serves: the saved model and transformers' answer on it."""

    path: Path  # HF folder, or a GGUF for llama.cpp
    params: int
    vocab: int
    prompt: list[int]  # the parity prompt
    reference: list[int]  # transformers' greedy tokens after it


def served(model: Any, params: int, path: Path, sizes: Sizes) -> Served:
    vocab = model.config.vocab_size
    prompt = Prompts(vocab, seed=0)(sizes.parity_prompt)
    return Served(path, params, vocab, prompt, hf_greedy(model, prompt, sizes.parity_new))


def measure(family: str, backend: str, model: Served, args: Any) -> Row:
    """One row: start the engine, then parity, cache hit and the timed runs."""
    sizes, prompts = SIZES[args.scale], Prompts(model.vocab, seed=1)
    row, start = Row(family, model.params, backend, parity=""), time.perf_counter()
    row.distinct = len(set(model.reference))
    try:
        engine = Engine(str(model.path), backend=backend, dtype="float32", max_total_tokens=8192)
    except Exception as exc:  # the backend's refusal (or a load failure), in one line
        row.parity = f"refused: {one_line(exc)}"
        return row
    with engine:
        try:
            row.parity = check_parity(engine, model.reference, model.prompt)
            row.cache_hit = check_cache_hit(engine, prompts, sizes)
            # warm-up of the timed paths (lazy setup), short: MLX's CPU build prefills slowly
            prefill_rate(engine, prompts(sizes.parity_prompt))
            decode_rate(engine, prompts(sizes.parity_prompt), 4)
            row.prefill_tps = statistics.median(
                prefill_rate(engine, prompts(sizes.prefill)) for _ in range(args.repeats)
            )
            row.decode_tps = statistics.median(
                decode_rate(engine, prompts(sizes.parity_prompt), sizes.decode)
                for _ in range(args.repeats)
            )
            engine.check_invariants(idle=True)
        except Exception as exc:
            row.parity = row.parity or f"error: {one_line(exc)}"
            row.cache_hit = row.cache_hit or f"error: {one_line(exc)}"
    row.seconds = round(time.perf_counter() - start, 1)
    return row


def measure_apart(family: str, backend: str, model: Served, args: Any) -> Row:
    """`measure` in a child process: a crash there is the row's error, not the run's end."""
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # no gdb attach (it hangs) on an abort
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        try:
            return pool.submit(measure, family, backend, model, args).result()
        except BrokenProcessPool:
            return Row(family, model.params, backend, parity="error: the process crashed")


def family_rows(family: str, args: Any, work: Path) -> list[Row]:
    """Build the family's model (and its GGUF twin for llama.cpp), then one row per backend."""
    sizes, models, failed = SIZES[args.scale], {}, ""
    if set(args.backends) - {"llamacpp"}:
        log(f"{family}: building the {args.scale} model")
        model, params = build(family, args.scale, work / family)
        models["hf"] = served(model, params, work / family, sizes)
    if "llamacpp" in args.backends:
        log(f"{family}: building and converting the {args.scale} model for llama.cpp")
        try:
            model, params, gguf = build_gguf(family, args.scale, work / f"{family}-gguf")
            models["gguf"] = served(model, params, gguf, sizes)
        except Exception as exc:  # the converter's refusal
            failed = f"refused: the GGUF converter failed: {one_line(exc)}"
    rows = []
    for backend in args.backends:
        model = models.get("gguf" if backend == "llamacpp" else "hf")
        if model is None:
            rows.append(Row(family, 0, backend, parity=failed))
            continue
        log(f"{family} on {backend}: {model.params / 1e6:.1f}M parameters")
        if backend == "llamacpp":  # a ggml assert aborts its process: not the table's
            rows.append(measure_apart(family, backend, model, args))
        else:
            rows.append(measure(family, backend, model, args))
        log(f"{family} on {backend}: {rows[-1].parity}, {rows[-1].seconds} s")
    return rows


def markdown(rows: Sequence[Row]) -> str:
    def rate(value: float | None) -> str:
        return "" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"

    lines = [
        "| family | params | backend | parity | cache hit | prefill tok/s | decode tok/s |",
        "|---|---:|---|---|---|---:|---:|",
    ]
    for r in rows:
        params = f"{r.params / 1e6:.1f}M" if r.params >= 1e6 else f"{r.params / 1e3:.0f}k"
        params = params if r.params else ""  # no model (the converter refused it)
        cells = [r.family, params, r.backend, r.parity, r.cache_hit]
        lines.append("| " + " | ".join(cells + [rate(r.prefill_tps), rate(r.decode_tps)]) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated")
    p.add_argument("--scale", choices=sorted(SCALES), default="100m")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    p.add_argument("--out", type=Path, help="write the rows (and the setup) as JSON here")
    args = p.parse_args(argv)
    args.families = [f for f in args.families.split(",") if f]
    args.backends = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(args.families) - set(FAMILIES)) + sorted(
        set(args.backends) - set(BACKENDS)
    )
    if unknown:
        p.error(f"unknown: {', '.join(unknown)} (families: {FAMILIES}; backends: {BACKENDS})")
    return args


def save(args: Any, rows: Sequence[Row], seconds: float) -> None:
    """The rows so far and the setup they were measured on, as JSON (after every family, so
    a long run that stops keeps what it measured)."""
    versions: dict[str, str | None] = {}
    for package in ("torch", "transformers", "mlx", "llama-cpp-python"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    setup = {"scale": args.scale, "sizes": asdict(SIZES[args.scale]), "dtype": "float32"}
    setup |= {"repeats": args.repeats, "seconds": round(seconds, 1), "cpus": os.cpu_count()}
    report = {"setup": setup | {"versions": versions}, "rows": [asdict(r) for r in rows]}
    args.out.write_text(json.dumps(report, indent=1))


def main(argv: Sequence[str] | None = None) -> list[Row]:
    args = parse_args(argv)
    started, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="family-table-") as work:
        for family in args.families:
            rows += family_rows(family, args, Path(work))
            if args.out is not None:
                save(args, rows, time.perf_counter() - started)
    print(markdown(rows))
    log(f"done in {time.perf_counter() - started:.1f} s")
    return rows


if __name__ == "__main__":
    main()
