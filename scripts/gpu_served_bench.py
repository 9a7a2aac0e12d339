#!/usr/bin/env python
"""Served decode on a GPU: `localradix bench` against `localradix serve`, overlap scheduler on/off.

    python scripts/gpu_served_bench.py --tokenizer DIR [--preset 1b] [--concurrency 64]
    python scripts/gpu_served_bench.py --tokenizer DIR --preset tiny --backend cpu   # a dry run

Builds gpu_check.py's random-weight Llama (the preset's shapes, the vocabulary of the tokenizer
in DIR) and saves it as a Hugging Face folder with that tokenizer. DIR holds tokenizer.json and
a chat template; the bundled SmolLM2's, exported with transformers, serves:

    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(DIR)

Then one `localradix bench` runs the workloads (agent and random by default) against two
launched servers with the same flags but `--overlap-schedule off` and `on` (in that order;
`--overlap-first` swaps it, to see what being first costs), and prints its table with the
ratios to the plain scheduler. Random weights write random text, so the requests
ignore EOS: every request decodes its full `max_tokens`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localradix.child_server import localradix_env  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
MODES = (("plain", "off"), ("overlap", "on"))


def build_model(folder: Path, preset: str, tokenizer: Path, device: str) -> None:
    """The preset's random Llama in bf16, with the tokenizer's vocabulary and special tokens."""
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_check import PRESETS

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer)
    shapes = {**PRESETS[preset], "vocab_size": len(tok)}
    config = transformers.LlamaConfig(
        **shapes, max_position_embeddings=8192, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, folder / name)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {preset} preset, {params / 1e9:.2f} B parameters, saved in {folder}")


def bench_argv(folder: Path, args: argparse.Namespace) -> list[str]:
    flags = f"--backend {args.backend} --dtype bfloat16 {args.server_args}".strip()
    servers = {mode: f"{mode}=launch:{flags} --overlap-schedule {switch}" for mode, switch in MODES}
    order = ["overlap", "plain"] if args.overlap_first else ["plain", "overlap"]
    argv = [sys.executable, "-m", "localradix", "bench", "--launch-model", str(folder)]
    argv += ["--compare", *(servers[mode] for mode in order), "--baseline", "plain"]
    argv += ["--warmup", str(args.warmup)]
    argv += ["--workload", *args.workload, "--concurrency", str(args.concurrency)]
    argv += ["--scale", str(args.scale), "--extra-body", json.dumps({"ignore_eos": True})]
    argv += ["--no-progress", *(["--output", str(args.output)] if args.output else ["--no-save"])]
    return argv


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokenizer", type=Path, required=True, help="folder with tokenizer.json")
    p.add_argument("--preset", default="1b", help="gpu_check.py's model shapes: 1b or tiny")
    p.add_argument("--backend", default="cuda", help="the servers' --backend (cpu: a dry run)")
    p.add_argument("--workload", nargs="+", default=["agent", "random"])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--scale", type=float, default=1.0, help="bench's --scale")
    p.add_argument("--warmup", type=int, default=1, help="bench's --warmup (tiny requests)")
    p.add_argument(
        "--overlap-first", action="store_true", help="launch the overlap server first (order check)"
    )
    p.add_argument("--server-args", default="", help="more `localradix serve` flags for both")
    p.add_argument("--output", type=Path, default=None, help="bench's JSON results")
    args = p.parse_args()

    device = "cuda" if args.backend in ("cuda", "rocm") else "cpu"
    with tempfile.TemporaryDirectory(prefix="localradix-served-") as tmp:
        folder = Path(tmp) / f"random-{args.preset}"
        build_model(folder, args.preset, args.tokenizer, device)
        return subprocess.call(bench_argv(folder, args), env=localradix_env())


if __name__ == "__main__":
    sys.exit(main())
