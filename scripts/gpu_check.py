#!/usr/bin/env python
"""GPU check of the CUDA backend: parity with transformers, then bf16 speed against the roofline.

    python scripts/gpu_check.py [--time-limit 300] [--device cuda] [--attention auto]
    python scripts/gpu_check.py --smoke       # CPU, tiny model: the same steps, in seconds

0. Versions (python, torch, CUDA/HIP, Triton, FlashInfer, the GPU) and the measured copy
   bandwidth, which is the roofline (a table's peak figure is printed beside it).
1. Builds a random-weight Llama model with transformers (no downloads; default ~0.86B params)
   and saves it to a temporary folder, so our runner loads it the way the CLI does.
2. fp32 parity: the CUDA runner (float32 runs the Triton kernels where Triton is installed,
   else torch-native attention: FlashInfer has no fp32 kernels) against transformers in fp32,
   greedy, several prompts decoded as one batch plus a
   request that extends a cached prefix. Each generated token must be transformers' argmax on
   the same sequence, or within a near-tie tolerance of it (printed).
3. bf16 parity: the chosen kernels (`--attention`: FlashInfer, else Triton, else torch-native)
   + CUDA graphs against transformers fp32 (wider tolerance), and their logits against the
   torch-native attention's on the same bf16 weights; decode steps sampled inside the graph
   (greedy, seeded random, filtered rows) against the eager sampler on the same logits.
4. bf16 speed (medians of 3 timed runs): decode at batch 1, 32, 128 with and without CUDA
   graphs (plain and overlapped steps; random sampling in the graph vs after an eager step); decode of 32 requests of mixed lengths; a 2k-token
   extend over an 8k cached prefix against a prefix-free 2k prefill; prefill of 4096 tokens;
   the fraction of the roofline reached at batch 1 (target >= 50%); transformers with a
   static cache and torch.compile at batch 1, as a same-GPU reference.
5. served decode: the same batches through the scheduler (radix cache, batching, sampling
   bookkeeping), with the plain loop and with the overlap scheduler.
Steps 1-4 are runner-level: batches are built directly (no HTTP, no scheduler). Exit status 1
if a parity check fails; the roofline target is reported, not enforced. Phases that would pass the time
limit are skipped and say so; the process is killed 60 s after the limit in any case. The
results go to `--json`, or to $OUT/gpu_check.json when $OUT is set (the device tool's folder).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localradix.config import ServerArgs  # noqa: E402
from localradix.sampling_params import SamplingParams  # noqa: E402
from localradix.step import (
    ForwardBatch,  # noqa: E402
    SamplingBatch,  # noqa: E402
)

PRESETS: dict[str, dict[str, Any]] = {  # Llama-family shapes: (hidden, layers, heads, kv heads, intermediate, vocab)
    "1b": dict(hidden_size=2048, num_hidden_layers=12, num_attention_heads=16,
               num_key_value_heads=4, intermediate_size=8192, vocab_size=32000),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=512),
}  # fmt: skip
# Peak HBM bandwidth in GB/s by device-name fragment, most specific first.
HBM_GBPS = (
    ("GH200 144G", 4900), ("GH200", 4000), ("H200", 4800), ("H100 NVL", 3900),
    ("H100 PCIe", 2000), ("H100", 3350), ("H800", 3350), ("H20", 4000), ("GB200", 8000),
    ("B200", 8000), ("B100", 8000), ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935),
    ("A100", 1555), ("A800", 2039), ("L40S", 864), ("L40", 864), ("L4", 300), ("A10G", 600),
    ("A10", 600), ("RTX 6000 Ada", 960), ("RTX 4090", 1008), ("RTX 3090", 936), ("V100", 900),
)  # fmt: skip
FP32_TOL, BF16_TOL = 0.01, 0.15  # near-tie tolerances, in units of the reference logits' std
BF16_LOGIT_TOL = 0.1  # the kernels vs torch-native bf16: max |diff| / std of the logits


@dataclass
class Report:
    checks: dict[str, bool] = field(default_factory=dict)
    numbers: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks[name] = ok
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)


class Clock:
    def __init__(self, limit: float) -> None:
        self.start, self.limit = time.monotonic(), limit

    def left(self) -> float:
        return self.limit - (time.monotonic() - self.start)

    def allows(self, phase: str, needs: float, report: Report) -> bool:
        if self.left() >= needs:
            return True
        report.skipped.append(phase)
        print(f"[SKIP] {phase}: {self.left():.0f} s left of the time limit", flush=True)
        return False


# ---- model and runners ---------------------------------------------------------------------


def build_hf_model(preset: str, device: str, folder: Path) -> Any:
    import transformers

    config = transformers.LlamaConfig(
        **PRESETS[preset], max_position_embeddings=8192, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).float().eval()
    model.save_pretrained(folder)
    return model


def build_runner(folder: Path, device: str, dtype: str, args: ServerArgs) -> Any:
    """Our runner for the saved model, built the way the CLI builds it on this device."""
    from localradix.loader import resolve_model

    source = resolve_model(str(folder))
    if device.startswith("cuda"):
        from localradix.platform import build_runner as platform_build

        built = platform_build(args.replace(backend="cuda", device=device, dtype=dtype), source)
        return built.runner
    from localradix.backends.cuda.runner import create_device_runner
    from localradix.platform import Target
    from localradix.runner.runner_config import RunnerConfig

    target = Target("cpu", device, dtype, "torch_native")
    settings = RunnerConfig.from_args(args)
    return create_device_runner(settings, source, target, "torch_native")[0]


class Slots:
    """A minimal scheduler stand-in: each request fills whole pages, fresh pages in order.

    `share` gives a new request the first n slots (n a multiple of the page size) of another's.
    """

    def __init__(self, page_size: int, capacity: int) -> None:
        self.page_size, self.next_page, self.capacity = page_size, 1, capacity
        self.tables: dict[str, list[int]] = {}

    def batch(self, new: dict[str, list[int]], share: dict[str, tuple[str, int]] | None = None):
        ids, tables, prefixes = [], [], []
        for name, tokens in new.items():
            table = self.tables.setdefault(name, [])
            if share and name in share and not table:
                source, n = share[name]
                table += self.tables[source][:n]
            prefixes.append(len(table))
            for _ in tokens:
                table.append(self._next_slot(table))
            ids.append(np.asarray(tokens, dtype=np.int64))
            tables.append(np.asarray(table, dtype=np.int64))
        return ForwardBatch.build(ids, tables, prefixes)

    def _next_slot(self, table: list[int]) -> int:
        if len(table) % self.page_size:
            return table[-1] + 1
        self.next_page += 1
        slot = (self.next_page - 1) * self.page_size
        if slot + self.page_size > self.capacity:  # a CUDA index assert, else: say it here
            raise RuntimeError(f"the KV pool holds {self.capacity} tokens; this check needs more")
        return slot


def greedy(n: int) -> SamplingBatch:
    return SamplingBatch.build([SamplingParams(temperature=0.0)] * n, np.zeros(n), [None] * n)


# ---- parity --------------------------------------------------------------------------------


def prompts_for(vocab: int, lengths: tuple[int, ...]) -> dict[str, list[int]]:
    """Random prompts; the last one starts with the first half of p1 (a shared prefix)."""
    rng = np.random.default_rng(1)
    prompts = {f"p{i}": rng.integers(3, vocab, n).tolist() for i, n in enumerate(lengths)}
    late = f"p{len(lengths) - 1}"
    prompts[late] = prompts["p1"][: len(prompts["p1"]) // 2] + prompts[late]
    return prompts


def generate(
    runner: Any, prompts: dict[str, list[int]], n_new: int, forced: dict | None = None
) -> tuple[dict, list]:
    """Greedy tokens per prompt, batched, and each step's logits (on the host).

    Step 0 prefills every prompt but the last in one batch; from step 1 the last one joins as
    an extend of p1's cached first half (its KV slots reused) while the others decode. With
    `forced`, those tokens are fed instead of the runner's own (to compare two runners' logits
    on identical inputs).
    """
    from localradix.runner.sampler import sample

    names, page = list(prompts), runner.page_size
    late, half = names[-1], len(prompts["p1"]) // 2 // page * page  # whole pages are shared
    slots, logits_log = Slots(page, runner.kv_capacity), []
    out: dict[str, list[int]] = {n: [] for n in names}
    new = {n: prompts[n] for n in names[:-1]}
    for step in range(n_new + 1):
        if step == 1:
            new[late] = prompts[late][half:]
        batch = slots.batch(new, {late: ("p1", half)})
        logits = runner.logits(batch)
        logits_log.append(logits.float().cpu())
        tokens = sample(logits, greedy(len(new))).token_ids  # sampled on the device
        fed = {}
        for name, token in zip(list(new), tokens):
            out[name].append(int(token))
            if len(out[name]) < n_new:
                fed[name] = [forced[name][len(out[name]) - 1] if forced else int(token)]
        new = fed
        if not new:
            break
    return out, logits_log


def mixed_sampling(n: int, step: int) -> SamplingBatch:
    """Greedy, seeded random and filtered rows (what the captured sampler must reproduce)."""
    kinds = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, seed=step),
        SamplingParams(temperature=1.0, top_p=0.9, top_k=40, min_p=0.02),
    ]
    params = [kinds[(i + step) % len(kinds)] for i in range(n)]
    return SamplingBatch.build(params, np.random.default_rng(step).random(n), [None] * n)


def check_graph_sampling(runner: Any, vocab: int, report: Report, steps: int = 8) -> None:
    """Decode steps sampled inside the CUDA graph must pick exactly the eager sampler's tokens
    on the same logits; reports whether the graph sampled at all."""
    from localradix.runner.sampler import sample

    graphs = getattr(runner, "graphs", None)
    if graphs is None:
        report.numbers["graph_sampling"] = {"in_graph": False, "why": "no decode graphs"}
        print("graph sampling: no decode graphs on this runner (sampled eagerly)", flush=True)
        return
    slots = Slots(runner.page_size, runner.kv_capacity)
    prompts = {
        f"g{i}": [3 + (7 * i + j) % (vocab - 3) for j in range(24 + 5 * i)] for i in range(5)
    }
    prefill_all(runner, slots, prompts, budget=4096)
    last, same, before = {n: [5] for n in prompts}, 0, dict(graphs.counts)
    for step in range(steps):
        batch, sb = slots.batch(last), mixed_sampling(len(last), step)
        got = runner.sample_step(batch, sb).token_ids.cpu().numpy()
        want = sample(runner.logits(batch), sb).token_ids  # the same step, sampled eagerly
        same += int(np.array_equal(got, want))
        last = {n: [int(t)] for n, t in zip(prompts, got)}
    in_graph = graphs.counts["sampled_in_graph"] - before["sampled_in_graph"]
    report.numbers["graph_sampling"] = {"in_graph": in_graph > 0, "steps": steps, "equal": same}
    report.check(
        "sampling inside the CUDA graph",
        in_graph == steps and same == steps,
        f"{in_graph}/{steps} steps sampled in the graph, {same}/{steps} equal to eager sampling",
    )


def check_greedy(hf: Any, prompts: dict, ours: dict, tol: float, report: Report, name: str):
    """Teacher-forced: transformers on prompt + our tokens; ours must be its argmax or a tie."""
    worst, exact, total = 0.0, 0, 0
    for key, prompt in prompts.items():
        seq = torch.tensor([prompt + ours[key][:-1]], device=hf.device)
        with torch.no_grad():
            ref = hf(seq).logits[0, len(prompt) - 1 :].float()
        chosen = ref.gather(1, torch.tensor(ours[key], device=ref.device)[:, None])[:, 0]
        gap = (ref.max(-1).values - chosen) / ref.std(-1)
        worst = max(worst, float(gap.max()))
        exact += int((gap == 0).sum())
        total += len(gap)
    report.numbers[f"{name}_exact_match"] = exact / total
    report.check(
        name,
        worst <= tol,
        f"{exact}/{total} tokens are transformers' argmax; worst gap {worst:.4f} std "
        f"(tolerance {tol})",
    )


def compare_logits(a: list, b: list, report: Report, kind: str) -> None:
    worst = 0.0
    for la, lb in zip(a, b, strict=True):
        worst = max(worst, float(((la - lb).abs().max(-1).values / lb.std(-1)).max()))
    report.numbers["kernels_vs_native_bf16"] = worst
    report.check(
        f"bf16 {kind} vs torch-native logits",
        worst <= BF16_LOGIT_TOL,
        f"max |diff| {worst:.4f} std (tolerance {BF16_LOGIT_TOL})",
    )


# ---- speed ---------------------------------------------------------------------------------


def weight_bytes_per_step(model: Any) -> int:
    """Bytes of weights one decode step reads (the input embedding: one row, not counted)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is not None:
        total -= model.embed_tokens.numel() * model.embed_tokens.element_size()
    return total


def hbm_gbps(device: str, override: float | None) -> tuple[float | None, str]:
    if override:
        return override, "--hbm-gbps"
    if not device.startswith("cuda"):
        return None, "none (CPU; pass --hbm-gbps)"
    name = torch.cuda.get_device_name(torch.device(device))
    for fragment, gbps in HBM_GBPS:
        if fragment.lower() in name.lower():
            return float(gbps), f"table entry {fragment!r} for {name}"
    return None, f"unknown device {name!r}; pass --hbm-gbps"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def versions(device: str) -> dict[str, str]:
    """What ran: interpreter, torch and its GPU toolkit, the kernel libraries, the device."""
    import importlib.metadata as meta

    found = {"python": platform.python_version(), "torch": torch.__version__}
    found["cuda"] = str(torch.version.cuda or "")
    found["hip"] = str(getattr(torch.version, "hip", "") or "")
    for package in ("triton", "flashinfer-python", "transformers", "numpy"):
        try:
            found[package] = meta.version(package)
        except meta.PackageNotFoundError:
            found[package] = "not installed"
    gpu = device.startswith("cuda") and torch.cuda.is_available()
    found["device"] = torch.cuda.get_device_name(torch.device(device)) if gpu else "cpu"
    return found


def median_rate(run: Any, work: float, reps: int = 3) -> float:
    """Work per second of `run()` (which syncs at its end): the median of `reps` timings."""
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        rates.append(work / (time.perf_counter() - start))
    return statistics.median(rates)


def copy_bandwidth(device: str) -> float:
    """GB/s of a device-to-device copy (bytes read plus bytes written): what a decode step,
    which streams the weights and the KV once, can at best use."""
    size = (1 << 30) if device.startswith("cuda") else (64 << 20)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)

    def copy() -> None:
        for _ in range(5):
            dst.copy_(src)
        sync(device)

    return median_rate(copy, 5 * 2 * size / 1e9)


def prefill_all(runner: Any, slots: Slots, prompts: dict[str, list[int]], budget: int) -> None:
    names = list(prompts)
    while names:
        group: list[str] = []
        tokens = 0
        while names and (not group or tokens + len(prompts[names[0]]) <= budget):
            tokens += len(prompts[names[0]])
            group.append(names.pop(0))
        runner.forward(slots.batch({n: prompts[n] for n in group}), greedy(len(group)))


def bench_decode(runner: Any, batch: int, ctx: int, steps: int, vocab: int, dev: str) -> dict:
    """Decode tok/s at `batch` requests of `ctx` tokens: plain steps, with and without the
    runner's CUDA graphs, and overlapped steps (medians of 3 timed runs)."""
    from localradix.runner.overlap import OverlapRunner

    slots = Slots(runner.page_size, runner.kv_capacity)
    prompts = {f"r{i}": [3 + (i + j) % (vocab - 3) for j in range(ctx)] for i in range(batch)}
    prefill_all(runner, slots, prompts, budget=8192)
    last = {n: [5] for n in prompts}

    def plain(sampling: SamplingBatch | None = None) -> None:
        nonlocal last
        for _ in range(steps):
            out = runner.forward(slots.batch(last), sampling or greedy(batch))
            last = {n: [int(t)] for n, t in zip(prompts, out.token_ids)}
        sync(dev)

    for _ in range(5):  # warm-up
        runner.forward(slots.batch(last), greedy(batch))
    sync(dev)
    rates = {"plain": median_rate(plain, batch * steps)}
    if runner.graphs is not None:  # seeded random + filtered rows: the sampler in the graph
        rates["sampled"] = median_rate(lambda: plain(mixed_sampling(batch, 1)), batch * steps)
    graphs, runner.graphs = runner.graphs, None
    rates["eager"] = median_rate(plain, batch * steps) if graphs is not None else rates["plain"]
    if graphs is not None:  # the same rows sampled after an eager step
        rates["sampled_eager"] = median_rate(lambda: plain(mixed_sampling(batch, 1)), batch * steps)
    runner.graphs = graphs
    overlap = OverlapRunner(runner, capacity=4 * batch)
    pending = overlap.launch(slots.batch(last), greedy(batch))

    def overlapped() -> None:
        nonlocal pending
        for _ in range(steps):
            new = {n: [int(p)] for n, p in zip(prompts, pending.placeholders)}
            following = overlap.launch(slots.batch(new), greedy(batch))
            pending.result()
            pending = following
        sync(dev)

    rates["overlap"] = median_rate(overlapped, batch * steps)
    pending.result()
    # the mean context of the plain runs (the roofline's KV bytes), which come first
    return {**rates, "context": ctx + 6 + 3 * steps // 2}


def bench_mixed_decode(runner: Any, lengths: list[int], steps: int, vocab: int, dev: str) -> float:
    """Decode tok/s of requests of different lengths in one batch (attention kernels then
    see ragged tables: the case equal-length benchmarks never show)."""
    slots = Slots(runner.page_size, runner.kv_capacity)
    prompts = {
        f"m{i}": [3 + (i + j) % (vocab - 3) for j in range(n)] for i, n in enumerate(lengths)
    }
    prefill_all(runner, slots, prompts, budget=8192)
    last = {n: [5] for n in prompts}

    def decode() -> None:
        nonlocal last
        for _ in range(steps):
            out = runner.forward(slots.batch(last), greedy(len(prompts)))
            last = {n: [int(t)] for n, t in zip(prompts, out.token_ids)}
        sync(dev)

    decode()  # warm-up
    return median_rate(decode, len(prompts) * steps)


def bench_extend_over_prefix(runner: Any, prefix: int, extend: int, vocab: int, dev: str) -> dict:
    """A new request's `extend` tokens over a cached `prefix` (a radix-cache hit: its first
    slots are the prefix's), against the same tokens prefilled with no prefix."""
    slots = Slots(runner.page_size, runner.kv_capacity)
    ids = [3 + j % (vocab - 3) for j in range(prefix)]
    prefill_all(runner, slots, {"prefix": ids}, budget=8192)
    tail = [5 + j % (vocab - 5) for j in range(extend)]
    hits = iter(range(1_000))

    def over_prefix() -> None:
        name = f"hit{next(hits)}"
        runner.forward(slots.batch({name: tail}, {name: ("prefix", prefix)}), greedy(1))
        sync(dev)

    over_prefix()  # warm-up
    hit = median_rate(over_prefix, extend)
    cold = bench_prefill(runner, extend, vocab, dev)
    return {"over_prefix_tok_s": hit, "no_prefix_tok_s": cold, "slowdown": cold / hit}


def bench_served(runner: Any, batch: int, ctx: int, new: int, overlap: bool, dev: str) -> float:
    """Decode tokens/s through the scheduler, after every request's prefill is done."""
    from localradix.messages import GenerateRequest
    from localradix.runner.overlap import OverlapRunner
    from localradix.sched.sched_config import SchedulerConfig
    from localradix.sched.scheduler import Scheduler

    vocab = runner.config.vocab_size
    args = ServerArgs(max_total_tokens=runner.kv_capacity, max_running_requests=batch)
    args = args.replace(page_size=runner.page_size, max_prefill_tokens=max(8192, batch * ctx))
    wrapped = OverlapRunner(runner, capacity=4 * batch + 4) if overlap else runner
    config = SchedulerConfig.from_args(args)
    sched = Scheduler(
        wrapped, config, context_len=8192, eos_token_ids=(), decode=str, vocab_size=vocab
    )
    params = SamplingParams(temperature=0.0, max_new_tokens=new, ignore_eos=True)
    for i in range(batch):  # distinct first tokens: no shared prefixes
        prompt = tuple(3 + (i * 7919 + j) % (vocab - 3) for j in range(ctx))
        sched.add_request(GenerateRequest(f"r{i}", prompt, params))
    produced = 0
    while produced < batch:  # every request has its first token: decode from here
        produced += sum(len(o.new_token_ids) for o in sched.step())
    sync(dev)
    start, decoded = time.perf_counter(), 0
    while sched.has_work():
        decoded += sum(len(o.new_token_ids) for o in sched.step())
    sync(dev)
    sched.check_invariants(idle=True)
    return decoded / (time.perf_counter() - start)


def bench_prefill(runner: Any, tokens: int, vocab: int, dev: str, reps: int = 3) -> float:
    ids = [3 + j % (vocab - 3) for j in range(tokens)]
    batch = Slots(runner.page_size, runner.kv_capacity).batch({"prompt": ids})
    runner.forward(batch, greedy(1))  # warm-up (and kernel compilation)
    sync(dev)

    def prefill() -> None:
        runner.forward(batch, greedy(1))  # rewrites the same slots
        sync(dev)

    return median_rate(prefill, tokens, reps)


def run_speed(runner: Any, opts: argparse.Namespace, clock: Clock, report: Report) -> None:
    model, config, dev = runner.model, runner.config, opts.device
    per_token_kv = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    per_token_kv *= runner.dtype.itemsize
    vocab = config.vocab_size
    for batch in opts.decode_batches:
        if not clock.allows(f"decode batch {batch}", 30, report):
            continue
        r = bench_decode(runner, batch, opts.context, opts.steps, vocab, dev)
        report.numbers[f"decode_b{batch}_tok_s"] = r
        print(
            f"decode batch {batch:>3}: {r['plain']:9.1f} tok/s ({r['eager']:.1f} without "
            f"graphs), {r['overlap']:9.1f} tok/s overlapped (context ~{r['context']})",
            flush=True,
        )
        if "sampled" in r:
            print(
                f"decode batch {batch:>3}, random sampling: {r['sampled']:9.1f} tok/s sampled in "
                f"the graph, {r['sampled_eager']:.1f} eager step + sampler",
                flush=True,
            )
        if batch == 1:
            roofline(model, per_token_kv, r, opts, report)
    if clock.allows("mixed-length decode", 30, report):
        rng = np.random.default_rng(7)
        lengths = rng.integers(opts.mixed_range[0], opts.mixed_range[1], opts.mixed_batch).tolist()
        rate = bench_mixed_decode(runner, lengths, opts.steps, vocab, dev)
        report.numbers["mixed_decode_tok_s"] = {"rate": rate, "lengths": lengths}
        print(
            f"mixed decode {len(lengths)} requests of {min(lengths)}-{max(lengths)} tokens: "
            f"{rate:9.1f} tok/s",
            flush=True,
        )
    if clock.allows("extend over a cached prefix", 30, report):
        prefix, extend = opts.extend_over
        r = bench_extend_over_prefix(runner, prefix, extend, vocab, dev)
        report.numbers["extend_over_prefix"] = {**r, "prefix": prefix, "extend": extend}
        verdict = "meets" if r["slowdown"] <= 2 else "misses"
        print(
            f"extend {extend} over a cached {prefix}: {r['over_prefix_tok_s']:9.1f} tok/s vs "
            f"{r['no_prefix_tok_s']:.1f} with no prefix ({r['slowdown']:.2f}x: {verdict} the "
            "2x target)",
            flush=True,
        )
    if clock.allows(f"prefill {opts.prefill_tokens}", 20, report):
        rate = bench_prefill(runner, opts.prefill_tokens, vocab, dev)
        report.numbers[f"prefill_{opts.prefill_tokens}_tok_s"] = rate
        print(f"prefill {opts.prefill_tokens} tokens: {rate:9.1f} tok/s", flush=True)
    for batch in opts.decode_batches:
        if not clock.allows(f"served decode batch {batch}", 20, report):
            continue
        served = {
            mode: bench_served(runner, batch, opts.context, opts.steps, mode == "overlap", dev)
            for mode in ("plain", "overlap")
        }
        report.numbers[f"served_decode_b{batch}_tok_s"] = served
        print(
            f"served decode batch {batch:>3}: {served['plain']:9.1f} tok/s plain scheduler, "
            f"{served['overlap']:9.1f} tok/s overlap scheduler",
            flush=True,
        )


def roofline(model: Any, per_token_kv: int, r: dict, opts: argparse.Namespace, report: Report):
    gbps, source = opts.roofline_gbps
    step_bytes = weight_bytes_per_step(model) + per_token_kv * r["context"]
    best = max(r["plain"], r["overlap"])
    if gbps is None:
        print(f"roofline: no bandwidth known ({source})", flush=True)
        return
    ceiling = gbps * 1e9 / step_bytes
    fraction = best / ceiling
    report.numbers["roofline_b1"] = {"fraction": fraction, "gbps": gbps, "bytes": step_bytes}
    verdict = "meets" if fraction >= 0.5 else "misses"
    print(
        f"roofline batch 1: {step_bytes / 1e9:.3f} GB/step at {gbps:.0f} GB/s ({source}) -> "
        f"{ceiling:.1f} tok/s ceiling; reached {best:.1f} = {100 * fraction:.1f}% "
        f"({verdict} the 50% target)",
        flush=True,
    )


def hf_compiled_reference(hf: Any, opts: argparse.Namespace, report: Report) -> None:
    """transformers at batch 1 in bf16 with a static cache and torch.compile: the same-GPU
    reference the batch-1 decode is held against."""
    model = hf.to(torch.bfloat16)
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    prompt = torch.arange(3, 3 + opts.context, device=model.device)[None] % model.config.vocab_size
    new = opts.steps
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
    for _ in range(2):  # compile and capture
        model.generate(prompt, **kw)
    sync(opts.device)

    def generate() -> None:
        model.generate(prompt, **kw)
        sync(opts.device)

    rate = median_rate(generate, new)
    report.numbers["hf_compiled_b1_tok_s"] = rate
    print(f"transformers bf16, static cache + torch.compile, batch 1: {rate:9.1f} tok/s")


# ---- main ----------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds for the whole check")
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", choices=sorted(PRESETS), default="1b")
    p.add_argument("--hbm-gbps", type=float, default=None, help="peak HBM bandwidth, GB/s")
    p.add_argument("--mem-fraction", type=float, default=0.3, help="KV pool share of free memory")
    p.add_argument("--page-size", type=int, default=1, help="tokens per KV page")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, small sizes")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument(
        "--attention",
        choices=("auto", "flashinfer", "triton", "torch_native"),
        default="auto",
        help="the bf16 runner's attention kernels",
    )
    p.add_argument("--no-hf-reference", action="store_true", help="skip the compiled HF run")
    opts = p.parse_args(argv)
    opts.decode_batches, opts.context, opts.steps, opts.prefill_tokens = (1, 32, 128), 512, 50, 4096
    opts.parity_lengths, opts.parity_new = (7, 50, 300, 120), 24
    opts.mixed_batch, opts.mixed_range, opts.extend_over = 32, (64, 4096), (8192, 2048)
    if opts.smoke:
        opts.device, opts.preset = "cpu", "tiny"
        opts.decode_batches, opts.context, opts.steps, opts.prefill_tokens = (1, 4), 16, 4, 64
        opts.parity_lengths, opts.parity_new = (5, 12, 20, 10), 6
        opts.mixed_batch, opts.mixed_range, opts.extend_over = 4, (4, 48), (64, 32)
        opts.no_hf_reference = True
    if opts.json is None and os.environ.get("OUT"):
        opts.json = Path(os.environ["OUT"]) / "gpu_check.json"
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    faulthandler.dump_traceback_later(opts.time_limit + 60, exit=True)
    clock, report = Clock(opts.time_limit), Report()
    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible: nothing to check (try --smoke on a CPU)")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity means fp32 matmuls
    torch.backends.cudnn.allow_tf32 = False
    report.numbers["versions"] = found = versions(opts.device)
    print("versions:", ", ".join(f"{k} {v}" for k, v in found.items() if v), flush=True)
    measured = copy_bandwidth(opts.device)
    peak, source = hbm_gbps(opts.device, None)
    report.numbers["copy_gbps"], report.numbers["table_peak_gbps"] = measured, peak
    print(f"copy bandwidth: {measured:.0f} GB/s measured (peak {peak} GB/s: {source})")
    opts.roofline_gbps = (
        (opts.hbm_gbps, "--hbm-gbps") if opts.hbm_gbps else (measured, "measured copy bandwidth")
    )
    with tempfile.TemporaryDirectory(prefix="localradix-gpu-check-") as tmp:
        folder = Path(tmp)
        started = time.monotonic()
        hf = build_hf_model(opts.preset, opts.device, folder)
        params = sum(p.numel() for p in hf.parameters())
        report.numbers["params"] = params
        took = time.monotonic() - started
        print(f"model: {opts.preset}, {params / 1e6:.1f} M parameters, saved in {took:.1f} s")
        run_checks(hf, folder, opts, clock, report)
    failed = [name for name, ok in report.checks.items() if not ok]
    summary = {**vars(report), "failed": failed, "elapsed_s": opts.time_limit - clock.left()}
    print("summary:", json.dumps(summary, default=str))
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps(summary, default=str, indent=2))
    return 1 if failed else 0


def run_checks(hf: Any, folder: Path, opts: argparse.Namespace, clock: Clock, report: Report):
    vocab = hf.config.vocab_size
    prompts = prompts_for(vocab, opts.parity_lengths)
    args = ServerArgs(max_total_tokens=8192 if not opts.smoke else 512, context_length=8192)
    args = args.replace(max_running_requests=8, page_size=opts.page_size)
    runner = build_runner(folder, opts.device, "float32", args)
    ours, _ = generate(runner, prompts, opts.parity_new)
    check_greedy(hf, prompts, ours, FP32_TOL, report, "fp32 greedy vs transformers")
    del runner
    if not opts.device.startswith("cuda"):
        report.skipped.append("bf16 FlashInfer parity (needs CUDA)")
        bench = build_runner(folder, opts.device, "float32", args)
        check_graph_sampling(bench, vocab, report)
        run_speed(bench, opts, clock, report)
        return
    if clock.allows("bf16 parity and speed", 60, report):
        run_bf16(hf, folder, prompts, opts, clock, report)


def run_bf16(hf: Any, folder: Path, prompts: dict, opts: argparse.Namespace, clock, report):
    from localradix.backends.cuda.runner import DeviceRunner

    # Each decode batch's requests hold their context and all 15 timed runs' tokens at once.
    kv = max(opts.decode_batches) * (opts.context + 15 * opts.steps + 16) + opts.page_size
    args = ServerArgs(mem_fraction=opts.mem_fraction, context_length=8192, max_total_tokens=kv)
    mixed = opts.mixed_batch * opts.mixed_range[1] + sum(opts.extend_over) * 4
    args = args.replace(
        max_running_requests=max(opts.decode_batches),
        page_size=opts.page_size,
        max_total_tokens=max(kv, mixed),
        attention=opts.attention,
    )
    started = time.monotonic()
    runner = build_runner(folder, opts.device, "bfloat16", args)
    kind = type(runner.attn).__name__
    graphs = runner.graphs.sizes if runner.graphs is not None else "none"
    took = time.monotonic() - started
    print(f"bf16 runner: {kind}, graphs {graphs}, KV {runner.kv_capacity} tokens, {took:.1f} s")
    report.numbers["bf16_attention"] = kind
    ours, logs = generate(runner, prompts, opts.parity_new)
    check_greedy(hf, prompts, ours, BF16_TOL, report, f"bf16 {kind} greedy vs transformers fp32")
    check_graph_sampling(runner, hf.config.vocab_size, report)
    if kind != "TorchNativeAttention":
        from localradix.runner.runner_config import RunnerConfig

        native_args = RunnerConfig.from_args(args.replace(max_total_tokens=16384))
        native = DeviceRunner(
            runner.model,
            runner.config,
            native_args,
            runner.device,
            runner.dtype,
            "torch_native",
            graphs=False,
        )
        _, native_logs = generate(native, prompts, opts.parity_new, forced=ours)
        compare_logits(logs, native_logs, report, kind)
        del native
    else:
        report.skipped.append("kernel vs torch-native logits (torch-native ran)")
    torch.cuda.empty_cache()
    run_speed(runner, opts, clock, report)
    del runner
    torch.cuda.empty_cache()
    if not opts.no_hf_reference and clock.allows("compiled transformers reference", 150, report):
        try:
            hf_compiled_reference(hf, opts, report)
        except Exception as exc:  # a reference that cannot compile must not fail the check
            print(f"[SKIP] compiled transformers reference: {type(exc).__name__}: {exc}")
            report.skipped.append(f"compiled transformers reference ({type(exc).__name__})")


if __name__ == "__main__":
    sys.exit(main())
