"""mlx-lm's MoE folders on MLX: experts stacked per layer under `switch_mlp` ([E, out, in],
float or packed by `mx.quantize`), as mlx-lm's SwitchGLU saves them, for Qwen3-MoE and Mixtral.

The folders are written here from tiny random transformers models. References: a float
switch_mlp folder decodes like transformers; a quantized one stays quantized (experts through
`gather_qmm`, the router at its own 8-bit override) and decodes like the same weights
dequantized and served as floats.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from localradix import Engine, SamplingParams
from localradix.config import ServerArgs
from localradix.loader import resolve_model
from localradix.platform import Target, backend_specs

from .conftest import VOCAB, hf_greedy, load_test_module, random_prompts, requires_mlx

pytestmark = requires_mlx

NEW = 8
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)
# mlx-lm's default (affine, 4 bits, group 64) with its MoE router override (8 bits)
QUANTIZATION = {"group_size": 64, "bits": 4, "mode": "affine"}
ROUTER_BITS = 8
_EXPERT = re.compile(r"(.+\.(?:mlp|block_sparse_moe))\.experts\.(\d+)\.(\w+)\.weight")
_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}  # Mixtral's names


def _hf_model(arch: str):
    import torch
    import transformers

    shape = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts_per_tok=2,
        max_position_embeddings=1024,
        initializer_range=0.2,  # peaky logits: quantization noise does not flip greedy tokens
    )
    if arch == "qwen3_moe":  # layer 1 stays a dense MLP
        config = transformers.Qwen3MoeConfig(
            **shape, num_experts=4, moe_intermediate_size=64, intermediate_size=128
        )
        config.mlp_only_layers = [1]
    else:
        config = transformers.MixtralConfig(**shape, num_local_experts=4, intermediate_size=64)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _stacked(folder: Path) -> dict:
    """The folder's float weights with each layer's experts stacked as mlx-lm's switch_mlp."""
    import mlx.core as mx

    weights = mx.load(str(folder / "model.safetensors"))
    assert isinstance(weights, dict)
    experts: dict[tuple[str, str], dict[int, mx.array]] = {}
    out = {}
    for name, w in weights.items():
        found = _EXPERT.fullmatch(name)
        if found is None:
            out[name] = w
        else:
            proj = _PROJ.get(found[3], found[3])
            experts.setdefault((found[1], proj), {})[int(found[2])] = w
    for (moe, proj), parts in experts.items():
        out[f"{moe}.switch_mlp.{proj}.weight"] = mx.stack([parts[e] for e in sorted(parts)])
    return out


def _quantized(weights: dict) -> tuple[dict, dict]:
    """Every matrix (stacked experts along their `in` axis) packed as `mx.quantize` packs it,
    and the config.json "quantization" block mlx-lm writes for it."""
    import mlx.core as mx

    block: dict = dict(QUANTIZATION)
    out = {}
    for name, w in weights.items():
        if w.ndim < 2:
            out[name] = w
            continue
        path = name.removesuffix(".weight")
        group, bits = QUANTIZATION["group_size"], QUANTIZATION["bits"]
        if path.endswith((".mlp.gate", ".block_sparse_moe.gate")):
            bits = ROUTER_BITS
            block[path] = {"group_size": group, "bits": bits}
        q, scales, biases = mx.quantize(w, group_size=group, bits=bits)
        out.update({name: q, f"{path}.scales": scales, f"{path}.biases": biases})
    return out, block


def _dequantized(weights: dict, block: dict) -> dict:
    """The float weights a quantized folder stands for, still in the switch_mlp layout."""
    import mlx.core as mx

    from localradix.backends.mlx.weights import group_quantized

    grouped = group_quantized(weights, block)
    return {n: w if isinstance(w, mx.array) else w.dequantize() for n, w in grouped.items()}


def _write(src: Path, dst: Path, weights: dict, quantization: dict | None = None) -> Path:
    import mlx.core as mx

    dst.mkdir(parents=True)
    mx.save_safetensors(str(dst / "model.safetensors"), weights)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, dst / f)
    config = json.loads((src / "config.json").read_text())
    if quantization is not None:
        config["quantization"] = quantization
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def folders(request, tmp_path_factory):
    """(transformers model, {"float", "quantized", "dequantized"}: switch_mlp folders)."""
    model = _hf_model(request.param)
    root = tmp_path_factory.mktemp(f"switch-{request.param}")
    model.save_pretrained(root / "hf")
    load_test_module("engine/conftest.py")._word_level_tokenizer(root / "hf")
    stacked = _stacked(root / "hf")
    packed, block = _quantized(stacked)
    return model, {
        "float": _write(root / "hf", root / "float", stacked),
        "quantized": _write(root / "hf", root / "quantized", packed, block),
        "dequantized": _write(root / "hf", root / "dequantized", _dequantized(packed, block)),
    }


def _greedy(folder: Path, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's greedy tokens alone, then again from the radix cache (same tokens)."""
    with Engine(str(folder), backend="mlx", dtype="float32", max_total_tokens=1024) as engine:
        cold = [engine.generate([p], GREEDY)[0].token_ids for p in prompts]
        warm = engine.generate(prompts, GREEDY)
        assert [r.token_ids for r in warm] == cold
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(warm, prompts, strict=True))
        engine.check_invariants(idle=True)
    return cold


# 40 tokens x 2 experts: the prefill takes the expert-sorted path, decode the unsorted one
PROMPTS = random_prompts(3, lengths=(6, 40))


def test_float_switch_mlp_matches_transformers(folders):
    model, made = folders
    assert _greedy(made["float"], PROMPTS) == [hf_greedy(model, p, NEW) for p in PROMPTS]


def test_quantized_switch_mlp_matches_its_dequantized_weights(folders):
    _, made = folders
    assert _greedy(made["quantized"], PROMPTS) == _greedy(made["dequantized"], PROMPTS)


def test_quantized_experts_stay_quantized(folders):
    """Experts run packed (one spec for the stack), the router at its own override."""
    from localradix.backends.mlx.quant import QuantSpec

    _, made = folders
    spec = backend_specs()["mlx"]
    target = Target("mlx", "cpu", "float32", spec.attention_backend)
    args = ServerArgs(max_total_tokens=256)
    runner, _ = spec.create_runner(args, resolve_model(str(made["quantized"])), target)
    moe = runner.model.layers[0].moe
    assert moe.gate_up.spec == moe.down.spec == QuantSpec(64, 4)
    assert moe.gate_up.weight.shape == (4, 2 * moe.intermediate, 64 * 4 // 32)
    assert moe.router.spec == QuantSpec(64, ROUTER_BITS)
    float_runner, _ = spec.create_runner(args, resolve_model(str(made["float"])), target)
    assert runner.model.weight_bytes < 0.3 * float_runner.model.weight_bytes
