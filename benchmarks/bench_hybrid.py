"""A hybrid model (Qwen3.5's shape) on localradix vs llama-server: cached prompt share and wall time.

Qwen3.5/3.6 interleave gated delta-net layers (one recurrent state per sequence) with full
attention. llama-server reuses such a state only from checkpoints it took near the end of the
same slot's previous prompt; localradix keeps state snapshots in its radix tree (branch points,
request ends, strides of cold prompts), shared by every request. This script:

1. builds a random-weight model of a small Qwen3.5's shape with transformers (`--shape 0.8b`:
   24 layers, 3 gated delta-net : 1 full attention, hidden 1024, as the published Qwen3.5-0.8B
   config; with SmolLM2's tokenizer and vocabulary (49,152) for a tokenizer the converter knows),
   converts it with llama.cpp's own converter and quantizes it with `llama-quantize` (Q4_K_M);
2. runs `benchmarks/bench_llamacpp.py` (agent and chat workloads, same threads and cells) on it;
3. builds the control the same way, a dense random-weight model of Qwen3-0.6B's shape (same
   tokenizer, so the same prompts, and replies as random as the hybrid's: a chat client sends
   each reply back as text, and random tokens seldom tokenize back to themselves, so a real
   model's cached share would not be comparable), and runs localradix alone on it for the dense
   model's cached share on the same workloads.

    python benchmarks/bench_hybrid.py --llama-cpp PATH/vendor/llama.cpp --bin PATH/build/bin
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from localradix.loader.gguf_convert import ensure_gguf_tokenizer
from localradix.store.bundled import find_bundled

HERE = Path(__file__).resolve().parent
TARGETS = {"agent": 0.35, "chat": 0.9}  # highest wall-time ratio localradix / llama-server
SHAPES = {  # transformers Qwen3_5TextConfig arguments
    "0.8b": dict(
        hidden_size=1024,
        intermediate_size=3584,
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=True,
    ),
}


DENSE = dict(  # Qwen3-0.6B's shape
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
)
COMMON = dict(vocab_size=49152, bos_token_id=1, eos_token_id=2, max_position_embeddings=32768)


def hybrid_config(shape: str) -> object:
    from transformers import Qwen3_5TextConfig

    layers = SHAPES[shape]["num_hidden_layers"]
    kinds = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
    return Qwen3_5TextConfig(layer_types=kinds, **COMMON, **SHAPES[shape])  # type: ignore[arg-type]


def dense_config() -> object:
    from transformers import Qwen3Config

    return Qwen3Config(**COMMON, **DENSE)  # type: ignore[arg-type]


def build(name: str, config: object, llama_cpp: Path, quantize: Path, out: Path) -> Path:
    """The quantized GGUF (cached in `out`)."""
    final = out / f"{name}-random-Q4_K_M.gguf"
    if final.is_file():
        return final
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        folder = Path(tmp) / "hf"
        AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16).save_pretrained(folder)
        _copy_tokenizer(folder)
        f16 = Path(tmp) / "model-f16.gguf"
        env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py")}
        converter = [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(folder)]
        extra = ["--no-mtp"] if "qwen35" in name else []
        subprocess.run([*converter, "--outfile", str(f16), "--outtype", "f16", *extra],
                       check=True, env=env)  # fmt: skip
        subprocess.run([str(quantize), str(f16), str(final), "Q4_K_M"], check=True)
    return final


def _copy_tokenizer(folder: Path) -> None:
    """SmolLM2's tokenizer (its pre-tokenizer hash is one llama.cpp's converter knows)."""
    source = ensure_gguf_tokenizer(find_bundled())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"  # Qwen's own class would change the hash
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def dense_shares(ns: argparse.Namespace, model: Path) -> dict[str, float | None]:
    """localradix alone on the dense control: cached share per workload."""
    from localradix.child_server import ServerProcess, free_port, localradix_argv, localradix_env

    port = free_port()
    server = ServerProcess(
        localradix_argv(("--backend", "llamacpp", "--threads", str(ns.threads),
                         "--max-total-tokens", str(ns.cells), "--log-level", "warning"),
                        port, str(model)),
        port, ready_timeout=600, env=localradix_env(),
    )  # fmt: skip
    output = Path(tempfile.mkstemp(prefix="bench-dense-", suffix=".json")[1])
    server.start()
    try:
        server.wait_ready()
        subprocess.run(
            [sys.executable, "-m", "localradix", "bench", "--no-progress", "--url", server.base,
             "--workload", *ns.workloads, "--scale", str(ns.scale), "--concurrency",
             str(ns.parallel), "--extra-body", '{"ignore_eos": true}', "--output", str(output)],
            check=True, env=localradix_env(),
        )  # fmt: skip
    finally:
        server.stop(keep_log=True)
    runs = json.loads(output.read_text())["runs"]
    return {r["workload"]["name"]: r.get("cached_share") for r in runs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree")
    p.add_argument("--bin", type=Path, required=True, help="folder with llama-server, -quantize")
    p.add_argument("--shape", default="0.8b", choices=sorted(SHAPES))
    p.add_argument("--out", type=Path, default=Path.home() / ".cache" / "localradix" / "bench")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cells", type=int, default=32768)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--workloads", nargs="+", default=["agent", "chat"])
    ns = p.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    quantize = ns.bin / "llama-quantize"
    model = build(f"qwen35-{ns.shape}", hybrid_config(ns.shape), ns.llama_cpp, quantize, ns.out)
    dense = build("qwen3-0.6b", dense_config(), ns.llama_cpp, quantize, ns.out)
    for path in (model, dense):
        print(f"model: {path} ({path.stat().st_size / 2**20:.0f} MiB)", flush=True)
    report = ns.out / "bench-hybrid.json"
    subprocess.run(
        [sys.executable, str(HERE / "bench_llamacpp.py"), "--llama-server",
         str(ns.bin / "llama-server"), "--model", str(model), "--threads", str(ns.threads),
         "--cells", str(ns.cells), "--parallel", str(ns.parallel), "--scale", str(ns.scale),
         "--workloads", *ns.workloads, "--output", str(report)],
        check=True,
    )  # fmt: skip
    print(summary(json.loads(report.read_text()), dense_shares(ns, dense)))
    return 0


def summary(report: dict, dense: dict[str, float | None]) -> str:
    """The issue's targets: wall time vs llama-server, cached share vs the dense model's."""
    runs = {(r["workload"]["name"], r["label"]): r for r in report["runs"]}
    lines = [
        "",
        "hybrid (Qwen3.5-0.8B shape) on localradix vs llama-server; dense: Qwen3-0.6B shape",
    ]
    for name, limit in TARGETS.items():
        base, ours = runs.get((name, "llama-server")), runs.get((name, "localradix"))
        if base is None or ours is None:
            continue
        ratio = ours["wall_time_s"] / base["wall_time_s"]
        shares = [_pct(r.get("cached_share")) for r in (base, ours)] + [_pct(dense.get(name))]
        lines.append(
            f"  {name:<6} wall s: llama-server {base['wall_time_s']:7.1f}  localradix "
            f"{ours['wall_time_s']:7.1f}  ratio {ratio:.2f} (target <= {limit}: "
            f"{'met' if ratio <= limit else 'MISSED'});  cached share: llama-server "
            f"{shares[0]}, localradix {shares[1]}, dense localradix {shares[2]}"
        )
    return "\n".join(lines)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


if __name__ == "__main__":
    raise SystemExit(main())
