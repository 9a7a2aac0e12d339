"""Decode attention over a shared cached prefix: cascade vs per-request gather (torch-native).

    python benchmarks/bench_attention.py [--prefix 1362] [--batch 8] [--own 40] [--dtype float32]

B decode requests share one cached prefix (a system prompt) and each has its own tail. The
torch-native backend attends the shared prefix once for the whole group ("cascade"); with the
grouping threshold raised past the prefix length it gathers the prefix for every request, as it
did before. Prints milliseconds per layer for both and checks they agree. Not a test: re-run
anytime (SmolLM2-135M head shapes by default: 9 query heads, 3 KV heads, head dim 64).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from localradix.model_api.kv_layout import KVLayout
from localradix.runner import attention_torch
from localradix.runner.attention_torch import TorchNativeAttention
from localradix.step import ForwardBatch


def per_layer_ms(attn: TorchNativeAttention, batch: ForwardBatch, qkv, reps: int) -> float:
    q, k, v = qkv
    attn.prepare(batch)
    for _ in range(5):
        attn.forward(q, k, v, 0, q.shape[-1] ** -0.5)
    start = time.perf_counter()
    for _ in range(reps):
        attn.forward(q, k, v, 0, q.shape[-1] ** -0.5)
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", type=int, default=1362, help="shared prefix tokens")
    ap.add_argument("--batch", type=int, default=8, help="decode requests sharing it")
    ap.add_argument("--own", type=int, default=40, help="tokens of each request's own tail")
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--reps", type=int, default=100)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    slots = args.prefix + args.batch * args.own + 1
    attn = TorchNativeAttention(KVLayout(1, args.kv_heads, args.head_dim, args.dtype, slots), "cpu")
    attn.k_cache.normal_()
    attn.v_cache.normal_()
    tail = args.prefix + 1 + np.arange(args.batch * args.own).reshape(args.batch, args.own)
    tables = [np.concatenate([np.arange(1, args.prefix + 1), own]) for own in tail]
    batch = ForwardBatch.build(
        [np.zeros(1, np.int64)] * args.batch, tables, [len(t) - 1 for t in tables]
    )
    g = torch.Generator().manual_seed(0)
    qkv = tuple(
        torch.randn(args.batch, h, args.head_dim, generator=g).to(dtype)
        for h in (args.heads, args.kv_heads, args.kv_heads)
    )
    outputs, times = {}, {}
    threshold = attention_torch.MIN_SHARED_PREFIX
    for mode, minimum in (("cascade", threshold), ("gather", args.prefix + 1)):
        attention_torch.MIN_SHARED_PREFIX = minimum
        times[mode] = per_layer_ms(attn, batch, qkv, args.reps)
        outputs[mode] = attn.forward(*qkv, 0, args.head_dim**-0.5).float()
    attention_torch.MIN_SHARED_PREFIX = threshold
    diff = (outputs["cascade"] - outputs["gather"]).abs().max().item()
    print(f"{args.batch} decode requests, {args.prefix}-token shared prefix, {args.own} own each")
    for mode in ("gather", "cascade"):
        print(f"{mode:<8} {times[mode]:8.3f} ms/layer")
    print(f"speed-up {times['gather'] / times['cascade']:.1f}x, max |diff| {diff:.2e}")


if __name__ == "__main__":
    main()
