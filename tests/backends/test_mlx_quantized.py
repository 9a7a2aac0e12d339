"""Quantized weights on MLX: MLX-format checkpoints (written with mlx's own `nn.quantize`) and
`--quantize` at load run as stored, and decode like their dequantized float twin.

The reference for a quantized checkpoint is the same weights dequantized with `mx.dequantize`
and run in float32 by transformers (greedy tokens) or by the torch runner (logprobs), so any
packing, grouping, fusing or override mistake shows up as a different token or logprob.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from localradix import Engine, SamplingParams
from localradix.config import ServerArgs
from localradix.loader import resolve_model
from localradix.platform import Target, backend_specs
from localradix.step import ForwardBatch, SamplingBatch

from .conftest import hf_greedy, random_prompts, requires_mlx, token_lists

pytestmark = requires_mlx

NEW = 10
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)
# Mixed precision as mlx-lm's recipes write it: a default, a wider layer, a float layer.
MIXED_4BIT = {
    "group_size": 32,
    "bits": 4,
    "model.layers.0.self_attn.v_proj": {"group_size": 32, "bits": 8},
    "model.layers.1.mlp.down_proj": {"group_size": 64, "bits": 6},
    "model.layers.1.self_attn.o_proj": False,
}


def _mlx_modules(weights):
    """An `nn.Module` tree with the checkpoint's names: Linear/Embedding for every matrix."""
    import mlx.nn as nn

    root = nn.Module()
    for name, w in weights.items():
        *path, leaf = name.split(".")
        parents = path[:-1] if w.ndim == 2 else path
        node = root
        for part in parents:
            node = node.setdefault(part, nn.Module())
        if w.ndim == 2:
            out_dims, in_dims = w.shape
            layer = (
                nn.Embedding(out_dims, in_dims)
                if path[-1] == "embed_tokens"
                else nn.Linear(in_dims, out_dims, bias=False)
            )
            layer.weight = w
            node[path[-1]] = layer
        else:
            node[leaf] = w
    return root


def write_mlx_quantized(src: Path, dst: Path, quantization: dict) -> Path:
    """`src` (an HF float folder) quantized by `nn.quantize` and saved as mlx-lm saves it."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    weights = mx.load(str(src / "model.safetensors"))
    root = _mlx_modules(weights)

    def predicate(path, module):
        override = quantization.get(path)
        return override if override is not None else hasattr(module, "to_quantized")

    mode = quantization.get("mode", "affine")
    nn.quantize(
        root, quantization["group_size"], quantization["bits"], mode=mode, class_predicate=predicate
    )
    dst.mkdir(parents=True)
    mx.save_safetensors(str(dst / "model.safetensors"), dict(tree_flatten(root.parameters())))
    for f in src.iterdir():
        if f.suffix == ".json" and f.name != "config.json":
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "quantization": quantization}))
    return dst


def dequantized_twin(folder: Path, hf_model, dst: Path):
    """The float32 transformers model holding exactly the dequantized weights of `folder`."""
    import mlx.core as mx
    import torch

    from localradix.backends.mlx.weights import group_quantized

    config = json.loads((folder / "config.json").read_text())
    stored = group_quantized(mx.load(str(folder / "model.safetensors")), config["quantization"])
    twin = copy.deepcopy(hf_model)
    state = twin.state_dict()
    for name, w in stored.items():
        dense = w if isinstance(w, mx.array) else w.dequantize()
        state[name] = torch.from_numpy(np.array(dense.astype(mx.float32)))
    if twin.config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    twin.load_state_dict(state)
    twin.save_pretrained(dst)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / f, dst / f)
    return twin


@pytest.fixture(scope="module")
def quantized(tiny_model, tmp_path_factory):
    """quantized(arch, quantization) -> (MLX-format folder, dequantized twin, its HF folder)."""
    made: dict = {}

    def make(arch: str, quantization: dict):
        key = (arch, json.dumps(quantization, sort_keys=True))
        if key not in made:
            src, hf = tiny_model(arch)
            root = tmp_path_factory.mktemp(f"q-{arch}")
            folder = write_mlx_quantized(src, root / "mlx", quantization)
            made[key] = (folder, dequantized_twin(folder, hf, root / "twin"), root / "twin")
        return made[key]

    return make


def _runner(backend: str, folder: Path, **args):
    spec = backend_specs()[backend]
    target = Target(backend, "cpu", "float32", spec.attention_backend)
    runner, _ = spec.create_runner(
        ServerArgs(max_total_tokens=256, **args), resolve_model(str(folder)), target
    )
    return runner


def _logprobs(runner) -> np.ndarray:
    """Full-vocabulary logprobs of each prompt's last token, for three prompts in one batch."""
    prompts = random_prompts(4, lengths=(9, 3, 17))
    starts = np.cumsum([1] + [len(p) for p in prompts])
    slots = [np.arange(s, s + len(p)) for s, p in zip(starts, prompts, strict=False)]
    batch = ForwardBatch.build([np.array(p) for p in prompts], slots, [0, 0, 0])
    params = [SamplingParams(temperature=0, logprobs=20)] * 3
    out = runner.forward(batch, SamplingBatch.build(params, np.full(3, 0.5), [None] * 3))
    return out.top_ids, out.top_logprobs


def _quantized_layers(runner) -> dict[str, tuple]:
    from localradix.backends.mlx.quant import Concat, Quantized

    def describe(w):
        if isinstance(w, Quantized):
            return (w.spec.bits, w.spec.group_size, w.spec.mode)
        if isinstance(w, Concat):
            return tuple(describe(p) for p in w.parts)
        return None

    model = runner.model
    layers = {"embed": describe(model.embed_tokens)}
    for i, layer in enumerate(model.layers):
        for part in ("qkv", "o_proj", "gate_up", "down_proj"):
            layers[f"{i}.{part}"] = describe(getattr(layer, part))
    return layers


@pytest.mark.parametrize(
    ("arch", "quantization"),
    [
        ("llama", MIXED_4BIT),
        ("qwen3", {"group_size": 32, "bits": 4, "mode": "mxfp4"}),
    ],
)
def test_greedy_matches_dequantized_twin(quantized, arch, quantization):
    """Alone, batched, from the cache and chunked: token for token like transformers running
    the dequantized weights."""
    folder, twin, _ = quantized(arch, quantization)
    prompts = random_prompts(11, lengths=(5, 40, 3, 23))
    refs = [hf_greedy(twin, p, NEW) for p in prompts]
    with Engine(
        str(folder),
        backend="mlx",
        dtype="float32",
        max_total_tokens=2048,
        chunked_prefill_size=16,  # the 40- and 23-token prompts prefill in chunks
    ) as engine:
        alone = [engine.generate([p], GREEDY)[0].token_ids for p in prompts]
        assert alone == refs
        again = engine.generate(prompts, GREEDY)  # batched, every prompt cached
        assert token_lists(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts, strict=True))
        engine.check_invariants(idle=True)


def test_mixed_checkpoint_keeps_each_layers_format(quantized):
    """Per-layer overrides are honoured, and a fused projection whose parts differ runs unfused."""
    folder, _, _ = quantized("llama", MIXED_4BIT)
    layers = _quantized_layers(_runner("mlx", folder))
    q4 = (4, 32, "affine")
    assert layers == {
        "embed": q4,
        "0.qkv": (q4, q4, (8, 32, "affine")),
        "0.o_proj": q4,
        "0.gate_up": q4,
        "0.down_proj": q4,
        "1.qkv": q4,
        "1.o_proj": None,
        "1.gate_up": q4,
        "1.down_proj": (6, 64, "affine"),
    }


QUANTIZATIONS = [
    {"group_size": 64, "bits": 2},
    {"group_size": 64, "bits": 3},
    {"group_size": 64, "bits": 5},
    {"group_size": 32, "bits": 6},
    {"group_size": 32, "bits": 8},
    {"group_size": 32, "bits": 8, "mode": "mxfp8"},
]


def _all_logits(runner) -> np.ndarray:
    """float32 logits at every position of one 30-token prompt (no sampling in the way)."""
    import mlx.core as mx

    prompt = np.array(random_prompts(5, lengths=(30,))[0])
    batch = ForwardBatch.build([prompt], [np.arange(1, 31)], [0])
    runner.attn.prepare(batch)
    ids, positions = mx.array(batch.input_ids), mx.array(batch.positions)
    return np.array(runner.model.compute_logits(runner.model.forward(ids, positions, runner.attn)))


def _error_bound(quantization: dict) -> float:
    """Relative logit error allowed: 6x a uniform quantizer's relative weight error (step /
    sqrt(12), a group spanning about 5 standard deviations); this two-layer model amplifies it
    4-4.5x at every width. mxfp8 (e4m3: 3 mantissa bits) is held to the 5-bit bound."""
    bits = 5 if quantization.get("mode") == "mxfp8" else quantization["bits"]
    return 6 * 5 / np.sqrt(12) / (2**bits - 1)


@pytest.mark.parametrize(
    "quantization", QUANTIZATIONS, ids=lambda q: f"{q.get('mode', 'q')}{q['bits']}"
)
def test_logprobs_equal_the_twin_and_near_the_float_model(tiny_model, quantized, quantization):
    """Every width and mode: logprobs equal the dequantized twin's (torch runner), and logits
    stay within the quantization error of the float model."""
    folder, _, twin_folder = quantized("qwen3", quantization)
    runner = _runner("mlx", folder)
    ids, got = _logprobs(runner)
    twin_ids, twin = _logprobs(_runner("cpu", twin_folder))
    assert ids.tolist() == twin_ids.tolist()
    np.testing.assert_allclose(got, twin, atol=2e-4)
    logits, float_logits = _all_logits(runner), _all_logits(_float_runner(tiny_model))
    error = np.linalg.norm(logits - float_logits) / np.linalg.norm(float_logits)
    assert error < _error_bound(quantization)


def _float_runner(tiny_model):
    return _runner("mlx", tiny_model("qwen3")[0])


def test_quantize_at_load_is_what_nn_quantize_writes(tiny_model, quantized):
    """`--quantize 4` on a float folder gives the layers, and the logprobs, of the same folder
    quantized by mlx's `nn.quantize` (affine, group 64, as mlx-lm's convert) and saved."""
    float_folder, _ = tiny_model("llama")
    at_load = _runner("mlx", float_folder, quantize="4")
    folder, _, _ = quantized("llama", {"group_size": 64, "bits": 4})
    stored = _runner("mlx", folder)
    layers = _quantized_layers(at_load)
    assert set(layers.values()) == {(4, 64, "affine")}
    assert layers == _quantized_layers(stored)
    (ids, lp), (ref_ids, ref_lp) = _logprobs(at_load), _logprobs(stored)
    assert ids.tolist() == ref_ids.tolist()
    np.testing.assert_allclose(lp, ref_lp, atol=1e-5)
    float_bytes = _runner("mlx", float_folder).model.weight_bytes
    assert at_load.model.weight_bytes < 0.2 * float_bytes  # 4 bits + scales vs 32 bits


def test_inconsistent_checkpoints_are_refused(tiny_model, quantized, tmp_path):
    folder, _, _ = quantized("llama", {"group_size": 64, "bits": 4})
    config = json.loads((folder / "config.json").read_text())
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    for quantization, message in [
        (None, 'no "quantization" entry'),
        ({"group_size": 64, "bits": 8}, "quantized tensors do not match"),
        ({"group_size": 64, "bits": 4, "lm_head": False, "model.norm": False}, None),
        ({"group_size": 64, "bits": 4, "model.layers.0.mlp.up_proj": False}, "not quantized"),
    ]:
        changed = {k: v for k, v in config.items() if k != "quantization"}
        if quantization is not None:
            changed["quantization"] = quantization
        (broken / "config.json").write_text(json.dumps(changed))
        if message is None:
            _runner("mlx", broken)  # overrides for layers that are not quantized are harmless
            continue
        with pytest.raises(ValueError, match=message):
            _runner("mlx", broken)
