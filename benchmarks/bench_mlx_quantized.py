"""Quantized vs float weights on the MLX backend: resident weight memory and decode speed.

    python benchmarks/bench_mlx_quantized.py [--steps 32] [--batch 1 4] [--random-1b]

The bundled SmolLM2-135M GGUF (Q4_1, token embedding Q8_0) runs as stored and dequantized to
float32; with --random-1b also a random-weight ~1.1B Llama, float32 vs `--quantize 4`. Each
line: weight MiB and decode tokens/s at each batch size (one prefill of 32 tokens per request
first). On `mlx[cpu]` (Linux) quantized_matmul runs single-threaded: these figures are for the
record, Apple-silicon speed is measured on a Mac. Not a test: re-run anytime.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from localradix.backends.mlx.model import MLXDecoderForCausalLM
from localradix.backends.mlx.quant import Quantized
from localradix.backends.mlx.runner import MLXRunner
from localradix.backends.mlx.weights import load_weights
from localradix.config import ServerArgs
from localradix.loader import resolve_model
from localradix.sampling_params import SamplingParams
from localradix.step import ForwardBatch, SamplingBatch
from localradix.store.source import ModelSource

PROMPT = 32


def build(source: ModelSource, quantize: str, dequantize: bool) -> MLXRunner:
    config, weights = load_weights(source, quantize)
    if dequantize:  # the float32 twin of a quantized checkpoint
        weights = {n: w.dequantize() if isinstance(w, Quantized) else w for n, w in weights.items()}
    model = MLXDecoderForCausalLM(config, weights, mx.float32)
    return MLXRunner(model, config, ServerArgs(max_total_tokens=4096), mx.Device(mx.cpu))


def decode_tps(runner: MLXRunner, batch: int, steps: int) -> float:
    rng = np.random.default_rng(0)
    vocab = runner.config.vocab_size
    slots = [
        np.arange(1 + i * (PROMPT + steps), 1 + (i + 1) * (PROMPT + steps)) for i in range(batch)
    ]
    prompts = [rng.integers(3, vocab, PROMPT) for _ in range(batch)]
    greedy = SamplingBatch.build(
        [SamplingParams(temperature=0)] * batch, np.zeros(batch), [None] * batch
    )
    out = runner.forward(
        ForwardBatch.build(prompts, [s[:PROMPT] for s in slots], [0] * batch), greedy
    )
    start = time.perf_counter()
    for step in range(steps):
        n = PROMPT + step
        tokens = [out.token_ids[i : i + 1] for i in range(batch)]
        out = runner.forward(
            ForwardBatch.build(tokens, [s[: n + 1] for s in slots], [n] * batch), greedy
        )
    return batch * steps / (time.perf_counter() - start)


def random_llama(folder: Path) -> ModelSource:
    """A ~1.1B-parameter Llama with random bfloat16 weights, saved as a Hugging Face folder."""
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
        "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
        "num_attention_heads": 32, "num_key_value_heads": 4, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    h, inter, kv = 2048, 5632, 2048 // 32 * 4
    shapes = {
        "model.embed_tokens.weight": (32000, h),
        "lm_head.weight": (32000, h),
        "model.norm.weight": (h,),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }  # fmt: skip
    arrays = {n: (0.02 * mx.random.normal(s)).astype(mx.bfloat16) for n, s in shapes.items()}
    mx.save_safetensors(str(folder / "model.safetensors"), arrays)
    return ModelSource(folder, "hf", "random-1.1b")


def report(label: str, runner: MLXRunner, batches: list[int], steps: int) -> None:
    speeds = ", ".join(f"batch {b}: {decode_tps(runner, b, steps):6.1f} tok/s" for b in batches)
    print(
        f"{label:<34} weights {runner.model.weight_bytes / 2**20:8.1f} MiB   {speeds}", flush=True
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="decode batch sizes")
    ap.add_argument("--random-1b", action="store_true", help="also a random ~1.1B Llama")
    args = ap.parse_args()
    bundled = resolve_model(None)
    report("SmolLM2-135M Q4_1 (as stored)", build(bundled, "auto", False), args.batch, args.steps)
    report("SmolLM2-135M dequantized float32", build(bundled, "auto", True), args.batch, args.steps)
    if args.random_1b:
        with tempfile.TemporaryDirectory() as tmp:
            source = random_llama(Path(tmp))
            report("random 1.1B --quantize 4", build(source, "4", False), args.batch, args.steps)
            report("random 1.1B float32", build(source, "auto", False), args.batch, args.steps)


if __name__ == "__main__":
    main()
