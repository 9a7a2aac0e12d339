"""Speculative decoding (--speculative ngram) on the bundled model: single-stream tokens/s with
speculation on and off for three workloads, in one run.

    python benchmarks/bench_speculative.py [--backend llamacpp|cpu] [--max-tokens 256]
        [--lines 300] [--k 8]

Workloads: a code edit (a ~300-line source file of this package in the prompt and "rewrite it
renaming X to Y": the answer is mostly the file again), summarise-with-quotes (a passage and
"summarise it, quoting its key sentences"), and free chat (no context to copy). Each runs
greedy, once plain and once speculating, from a flushed cache whose only entry is its own
prompt (so drafts come from the request, never from the other run's output) and with the
prompt already computed (so the time is decode only). Prints tokens/s of both, their ratio,
the acceptance rate, accepted drafts per verify step, tokens per step, whether the outputs
are the same, and the verify cost model's fit (per-step, per-row and per-row-per-1k-context
seconds, and a draft row's cost beta at the prompt's context). Where on and off differ, it
prints the first differing token and the gap between the two candidates' log-probabilities
in a one-request run: llama.cpp's logits depend on the batch's shape in the last bits, so a
near-tie can go either way. Not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from localradix import Engine, SamplingParams

PASSAGE = (
    "The radix tree keeps every prompt and every answer the engine has seen, keyed by their "
    "tokens. When a new request arrives, the scheduler walks the tree to find the longest "
    "cached prefix and computes only the rest. Requests that share a system prompt therefore "
    "pay for it once. Eviction removes the least recently used leaves when memory runs short, "
    "so a popular prefix stays while one-off tails go first. Because a request holds a lock on "
    "the node it reads from, nothing it depends on can be evicted while it runs. The same tree "
    "also serves speculative decoding: a request's own context and the cached sequences are "
    "searched for the longest recent match of its last tokens, and what followed becomes a "
    "draft that the model verifies in one step."
)


@dataclass(frozen=True)
class Run:
    tokens: list[int]
    seconds: float
    steps: int
    drafted: int
    accepted: int

    @property
    def rate(self) -> float:
        return len(self.tokens) / self.seconds


def workloads(lines: int) -> dict[str, str]:
    source = Path(__file__).resolve().parents[1] / "localradix/backends/llamacpp/runner.py"
    code = "\n".join(source.read_text().splitlines()[:lines])
    return {
        "code edit": "Rewrite this Python file, renaming `batch` to `step_batch` everywhere. "
        "Output only the code.\n\n```python\n" + code + "\n```",
        "summarise+quotes": "Summarise this passage in a few sentences, quoting its key "
        'sentences word for word in "double quotes".\n\n' + PASSAGE,
        "free chat": "What are three good habits for staying healthy while working at a desk?",
    }


def prompt_ids(engine: Engine, text: str) -> list[int]:
    tok = engine.tokenizer
    chat = [{"role": "user", "content": text}]
    return tok.encode(
        tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )


def timed(engine: Engine, ids: list[int], params: SamplingParams) -> Run:
    engine.flush_cache()
    engine.generate([ids], params.replace(max_new_tokens=1))  # the prompt, computed and cached
    before = engine.stats()
    start = time.perf_counter()
    out = engine.generate([ids], params)[0]
    seconds = time.perf_counter() - start
    after = engine.stats()
    return Run(
        out.token_ids,
        seconds,
        after.spec_verify_steps - before.spec_verify_steps,
        after.spec_draft_tokens - before.spec_draft_tokens,
        after.spec_accepted_tokens - before.spec_accepted_tokens,
    )


def divergence(engine: Engine, ids: list[int], off: list[int], on: list[int]) -> str:
    """Where `on` first differs from `off`, and how far apart the two tokens' log-probs are."""
    i = next((j for j, (a, b) in enumerate(zip(off, on)) if a != b), min(len(off), len(on)))
    if i == len(off) == len(on):
        return ""
    engine.flush_cache()
    one = SamplingParams(temperature=0, max_new_tokens=1, logprobs=5, speculative=False)
    top = dict(engine.generate([ids + off[:i]], one)[0].logprobs[0].top)
    gap = [f"{top[t]:.3f}" if t in top else "<top5" for t in (off[i : i + 1] + on[i : i + 1])]
    return (
        f"  first differs at token {i}: off {off[i : i + 1]} / on {on[i : i + 1]}, logprobs {gap}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="llamacpp", choices=("llamacpp", "cpu"))
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--lines", type=int, default=300, help="lines of source in the code edit")
    ap.add_argument("--k", type=int, default=8, help="--speculative-k")
    ap.add_argument("--only", nargs="*", default=None, help="workloads to run (default: all)")
    args = ap.parse_args()
    extra = {"dtype": "float32"} if args.backend == "cpu" else {}
    params = SamplingParams(temperature=0, max_new_tokens=args.max_tokens)
    with Engine(
        backend=args.backend,
        speculative="ngram",
        speculative_k=args.k,
        max_total_tokens=16384,
        **extra,
    ) as engine:
        print(f"backend {args.backend}, k <= {args.k}, up to {args.max_tokens} new tokens")
        header = (
            f"{'workload':18} {'prompt':>6} {'off tok/s':>9} {'on tok/s':>9} {'ratio':>6} "
            f"{'accept':>6} {'acc/step':>8} {'tok/step':>8} verify same"
        )
        print(header)
        for name, text in workloads(args.lines).items():
            if args.only and not any(name.startswith(o) for o in args.only):
                continue
            ids = prompt_ids(engine, text)
            off = timed(engine, ids, params.replace(speculative=False))
            on = timed(engine, ids, params)
            rate = on.accepted / on.drafted if on.drafted else 0.0
            per_step = on.accepted / on.steps if on.steps else 0.0
            print(
                f"{name:18} {len(ids):6d} {off.rate:9.1f} {on.rate:9.1f} "
                f"{on.rate / off.rate:6.2f} {rate:6.2f} {per_step:8.2f} "
                f"{(on.accepted + on.steps) / max(on.steps, 1):8.2f} "
                f"{on.steps:5d} verify steps "
                f"{'yes' if on.tokens == off.tokens else 'no'} ({len(on.tokens)} tokens)"
            )
            costs = engine.core.scheduler.speculator.costs
            c0, c1, c2 = costs.coefficients
            beta = costs.beta(1, len(ids), len(ids))
            print(
                f"  cost fit: step {c0 * 1e3:.1f} ms + row {c1 * 1e3:.1f} ms + row/1k ctx "
                f"{c2 * 1e3:.1f} ms; draft row beta {beta:.2f} at {len(ids)} tokens"
            )
            if on.tokens != off.tokens:
                print(divergence(engine, ids, off.tokens, on.tokens))


if __name__ == "__main__":
    main()
