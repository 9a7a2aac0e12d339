"""Decode throughput with grammar-constrained requests in the batch (issue 7). Not a test.

    python benchmarks/bench_constrained.py [--model PATH] [--batch 16] [--tokens 64]

Runs the same batch twice on the in-process Engine: every request unconstrained, then half of
them constrained by a JSON schema (compiled once, before timing). Prints output tokens/s for
both and the slowdown (target: <= 10%). Both runs prefill the same prompts.
"""

from __future__ import annotations

import argparse
import json
import time

from localradix import Engine, SamplingParams
from localradix.sampling_params import Constraint

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "review": {"type": "string", "minLength": 400},
    },
    "required": ["title", "rating", "review"],
}


def run(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> float:
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    return sum(r.completion_tokens for r in results) / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with Engine(args.model, max_total_tokens=65536) as engine:
        prompts = []
        for i in range(args.batch):
            messages = [{"role": "user", "content": f"Review product number {i} as JSON."}]
            text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            prompts.append(engine.tokenizer.encode(text))
        free = SamplingParams(temperature=0.7, max_new_tokens=args.tokens, ignore_eos=True, seed=1)
        bound = free.replace(constraint=Constraint("json_schema", json.dumps(SCHEMA)))
        mixed = [bound if i % 2 == 0 else free for i in range(args.batch)]
        engine.generate(prompts[:2], [bound, free])  # compile the grammar, warm up
        plain, constrained = [], []
        for _ in range(args.repeats):  # interleaved, so drift in machine load hits both
            plain.append(run(engine, prompts, [free] * args.batch))
            constrained.append(run(engine, prompts, mixed))
    best_plain, best_mixed = max(plain), max(constrained)
    print(f"batch {args.batch}, {args.tokens} tokens out, best of {args.repeats}")
    print(f"none constrained : {best_plain:8.1f} tok/s")
    print(f"half constrained : {best_mixed:8.1f} tok/s")
    print(f"slowdown         : {100 * (1 - best_mixed / best_plain):8.1f} %  (target <= 10%)")


if __name__ == "__main__":
    main()
