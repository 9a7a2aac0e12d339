"""What keeping every sliding-window cell (`swa_full`) costs on llama.cpp, measured.

localradix's llama.cpp runner shares one unified KV cache between all sequences (running
requests and cached prefixes) and sets `swa_full`, so a sliding-window model's (Gemma 2-4,
gpt-oss, Cohere2) cached prefixes stay reusable at any branch point: without it llama.cpp drops
a sequence's SWA cells once they fall out of its window, and a later request could not resume
inside that prefix. This script creates llama.cpp contexts for a GGUF with `swa_full` on and
off, for several sequence-id counts, and prints the SWA cache's cells (read from llama.cpp's own
log line) and bytes. llama.cpp sizes a unified cache's SWA part as
min(n_ctx, n_swa * n_seq_max + n_ubatch): with the many sequence ids a radix cache needs, it is
all of n_ctx either way.

    python benchmarks/bench_swa_cells.py --model gemma.gguf [--ctx 32768]
"""

from __future__ import annotations

import argparse
import ctypes
import re

from localradix.gguf_file import read_gguf
from localradix.loader.gguf_config import gguf_model_config

SWA_CELLS = re.compile(r"creating\s+SWA KV cache, size = (\d+) cells")


class _Cells:
    """llama.cpp's log, read for the SWA cache's size (its own words, not our formula)."""

    def __init__(self) -> None:
        import llama_cpp

        self.cells: list[int] = []

        @llama_cpp.llama_log_callback
        def read(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            found = SWA_CELLS.search(text.decode("utf-8", "replace"))
            if found:
                self.cells.append(int(found.group(1)))

        self._callback = read  # ctypes calls it until the process ends: keep it alive
        llama_cpp.llama_log_set(read, ctypes.c_void_p(0))


def swa_cells(model: object, ctx: int, n_seq: int, swa_full: bool, handler: _Cells) -> int:
    import llama_cpp.llama_cpp as llama

    params = llama.llama_context_default_params()
    params.n_ctx, params.n_seq_max, params.kv_unified = ctx, n_seq, True
    params.swa_full, params.n_batch, params.n_ubatch = swa_full, 512, 512
    params.flash_attn_type = 1
    handler.cells.clear()
    context = llama.llama_init_from_model(model, params)
    if not context:
        raise RuntimeError("llama.cpp could not create the context")
    llama.llama_free(context)
    if not handler.cells:
        raise RuntimeError("llama.cpp did not log an SWA cache: is this a sliding-window model?")
    return handler.cells[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a sliding-window GGUF (Gemma 2-4, gpt-oss)")
    p.add_argument("--ctx", type=int, default=32768, help="KV cells (n_ctx)")
    p.add_argument("--seqs", type=int, nargs="+", default=[1, 4, 64, 130, 256])
    ns = p.parse_args()
    import llama_cpp.llama_cpp as llama

    handler = _Cells()
    config = gguf_model_config(read_gguf(ns.model, tensors=False).metadata)
    per_cell = 2 * config.num_key_value_heads * config.head_dim * 2  # K and V, float16
    model = llama.llama_model_load_from_file(ns.model.encode(), llama.llama_model_default_params())
    print(f"{ns.model}: window {config.sliding_window}, n_ctx {ns.ctx}")
    print(f"{'seq ids':>8} {'swa_full off':>14} {'swa_full on':>13}  (SWA cells per SWA layer)")
    for n_seq in ns.seqs:
        off = swa_cells(model, ns.ctx, n_seq, False, handler)
        on = swa_cells(model, ns.ctx, n_seq, True, handler)
        more = per_cell * (on - off) / 2**20
        print(f"{n_seq:>8} {off:>14,} {on:>13,}  ({more:.1f} MiB more per SWA layer)")
    llama.llama_model_free(model)


if __name__ == "__main__":
    main()
