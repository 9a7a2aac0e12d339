"""What a llama.cpp step costs, by batch size and by idle cells in the unified KV cache.

Raw `llama_decode` on one context built as the llamacpp backend builds it (unified KV, 256
sequence ids, flash attention): `--batch` sequences of `--prompt` tokens (after a `--shared`
prefix they all tag) decode together while `--idle` cells of other sequences (512 tokens each)
sit in the cache, as cached prefixes do. Every step's attention scans every live cell, so idle
cells slow every request: this is the measurement behind the backend's default
`--max-cached-tokens`. With `--shared 1450 --prompt 60 --batch 8 --idle 0` it is the decode
step of the bench's `agent` workload (32 x 48 tokens, 8 at a time: 192 such steps).

    python benchmarks/bench_llamacpp_cells.py [--model X.gguf] [--batch 1 8] [--idle 0 8192]
        [--prompt 64] [--shared 0]
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np

from localradix.loader import resolve_model
from localradix.loader.llama_openmp import settle_openmp

IDLE_SEQ = 512  # tokens per idle sequence
FIRST_IDLE_SEQ = 100  # idle sequences' ids start here, past the decoding ones


def main() -> int:
    ns = _parser().parse_args()
    settle_openmp()
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's own log
    import llama_cpp.llama_cpp as llama

    from localradix.backends.llamacpp.batch import LlamaBatch

    llama.llama_backend_init()
    path = str(resolve_model(ns.model).path)
    model = llama.llama_model_load_from_file(path.encode(), llama.llama_model_default_params())
    ctx = llama.llama_init_from_model(model, _context_params(llama, ns))
    batch = LlamaBatch(llama, 2048)
    print(f"{'idle cells':>10} {'batch':>5} {'ms/step':>8} {'tok/s':>7}")
    for idle in ns.idle:
        for n in ns.batch:
            ms = _step_ms(llama, ctx, batch, idle, n, ns)
            print(f"{idle:>10} {n:>5} {ms:>8.2f} {n / ms * 1e3:>7.1f}", flush=True)
    llama.llama_free(ctx)
    llama.llama_model_free(model)
    return 0


def _context_params(llama, ns: argparse.Namespace):
    params = llama.llama_context_default_params()
    params.n_ctx = ns.cells
    params.n_batch, params.n_ubatch = 2048, 512
    params.n_seq_max = params.n_outputs_max = 256
    params.n_threads = params.n_threads_batch = ns.threads
    params.flash_attn_type = 1
    params.kv_unified = True
    params.type_k = params.type_v = 1  # float16, the backend's default
    params.no_perf = True
    return params


def _step_ms(llama, ctx, batch, idle: int, n: int, ns: argparse.Namespace) -> float:
    """Mean ms of one decode step of `n` sequences with `idle` other cells live."""
    for k in range(idle // IDLE_SEQ):
        _decode(llama, ctx, batch, np.full(IDLE_SEQ, 100 + k), np.arange(IDLE_SEQ),
                np.full(IDLE_SEQ, FIRST_IDLE_SEQ + k))  # fmt: skip
    shared, own = ns.shared, ns.prompt
    for start in range(0, shared, 512):  # the shared prefix, on sequence 0
        end = min(start + 512, shared)
        _decode(llama, ctx, batch, np.full(end - start, 150), np.arange(start, end),
                np.zeros(end - start))  # fmt: skip
    memory = llama.llama_get_memory(ctx)
    for s in range(1, n + 1):  # each tags the shared cells (as the backend shares a prefix)
        if shared:
            llama.llama_memory_seq_cp(memory, 0, s, 0, shared)
        _decode(llama, ctx, batch, np.full(own, 200 + s), np.arange(shared, shared + own),
                np.full(own, s))  # fmt: skip
    start = time.perf_counter()
    for k in range(ns.steps):
        _decode(llama, ctx, batch, np.full(n, 300), np.full(n, shared + own + k),
                np.arange(1, n + 1))  # fmt: skip
    elapsed = time.perf_counter() - start
    llama.llama_memory_clear(memory, True)
    return elapsed / ns.steps * 1e3


def _decode(llama, ctx, batch, tokens, positions, seqs) -> None:
    n = len(tokens)
    batch.fill(tokens.astype(np.int32), positions.astype(np.int32), seqs.astype(np.int32),
               np.array([n - 1]))  # fmt: skip
    if llama.llama_decode(ctx, batch.struct) != 0:
        raise RuntimeError("llama_decode failed")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF file (default: the bundled SmolLM2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cells", type=int, default=32768, help="KV cells of the context")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--idle", type=int, nargs="+", default=[0, 4096, 8192, 16384])
    p.add_argument("--steps", type=int, default=30, help="decode steps timed per row")
    p.add_argument("--prompt", type=int, default=64, help="each decoding sequence's own tokens")
    p.add_argument(
        "--shared", type=int, default=0, help="a prefix every decoding sequence shares (tagged)"
    )
    return p


if __name__ == "__main__":
    raise SystemExit(main())
