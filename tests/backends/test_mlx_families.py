"""The 2026 families on the MLX backend, greedy token for token like transformers (float32):
alone, batched from a cache hit, continued past a long cached prefix, chunked, with the
engine's invariants checked after. The tiny checkpoints are the torch tests' own configs
(tests/models/), so both backends are held to the same models. Plus the MLX runner's precise
refusal of what it does not implement."""

from __future__ import annotations

import pytest

from localradix import Engine, SamplingParams

from .conftest import hf_greedy, load_test_module, random_prompts, requires_mlx

pytestmark = [requires_mlx, pytest.mark.slow]
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
_engine_helpers = load_test_module("engine/conftest.py")


def _save(model, folder) -> None:
    model.save_pretrained(folder)
    _engine_helpers._word_level_tokenizer(folder)


def _build(tmp_path_factory, name: str, config, randomise=None):
    """(saved folder, the transformers model in fp32 eval mode)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if randomise is not None:
        randomise(model)
    folder = tmp_path_factory.mktemp(name)
    _save(model, folder)
    return folder, model


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def _tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def check_family(folder, hf, prompts, new: int, chunk: int, longer_than: int = 0) -> None:
    """Alone, batched from a cache hit, a prompt running on into its own output (a cached
    prefix longer than `longer_than`), then chunked prefill with the cache flushed."""
    refs = [hf_greedy(hf, p, new) for p in prompts]
    with Engine(str(folder), backend="mlx", dtype="float32", max_total_tokens=4096) as engine:
        assert [engine.generate([p], _greedy(new))[0].token_ids for p in prompts] == refs
        again = engine.generate(prompts, _greedy(new))  # batched, every prompt now cached
        assert _tokens(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts, strict=True))
        k = new - 8
        longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
        run_on = engine.generate([prompts[longest] + refs[longest][:k]], _greedy(8))[0]
        assert run_on.token_ids == refs[longest][k:]
        assert run_on.cached_tokens > longer_than
        engine.check_invariants(idle=True)
    with Engine(
        str(folder),
        backend="mlx",
        dtype="float32",
        max_total_tokens=4096,
        chunked_prefill_size=chunk,
    ) as engine:
        longer = [p + r[:k] for p, r in zip(prompts, refs, strict=True)]
        assert _tokens(engine.generate(longer, _greedy(8))) == [r[k:] for r in refs]
        engine.check_invariants(idle=True)
    check_retraction(folder, hf, prompts, new)


def check_retraction(folder, hf, prompts, new: int, backend: str = "mlx") -> None:
    """A pool that holds the longest request but not the batch: decode retracts some requests
    and resumes them, with the same tokens."""
    pool = max(len(p) for p in prompts) + new + 4
    assert sum(len(p) + new for p in prompts) > pool  # (else nothing would be retracted)
    args = {"dtype": "float32", "max_total_tokens": pool, "new_token_ratio": 0.05}
    with Engine(str(folder), backend=backend, **args) as engine:
        assert _tokens(engine.generate(prompts, _greedy(new))) == [
            hf_greedy(hf, p, new) for p in prompts
        ]
        assert engine.stats().retractions > 0
        engine.check_invariants(idle=True)


def _hf_logprobs(hf, prompt: list[int], tokens: list[int]) -> list[float]:
    """transformers' log-softmax of its logits at each of `tokens`, after `prompt`."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)[torch.arange(len(tokens)), tokens].tolist()


def check_logprobs(folder, hf, prompt: list[int], new: int) -> None:
    """The greedy tokens' logprobs equal transformers' log-softmax of its logits."""
    params = SamplingParams(temperature=0, max_new_tokens=new, ignore_eos=True, logprobs=1)
    with Engine(str(folder), backend="mlx", dtype="float32", max_total_tokens=1024) as engine:
        out = engine.generate([prompt], params)[0]
    got = [t.logprob for t in out.logprobs]
    assert got == pytest.approx(_hf_logprobs(hf, prompt, out.token_ids), abs=1e-4)


def check_shared_prefix(folder, hf, new: int) -> None:
    """Requests decoding together on a cached 70-token prefix: full-attention layers attend to
    it once for the group (cascade), windowed ones see only their window. Logprobs too, as
    the greedy tokens alone may not show a sink missing from the cascade's merge."""
    prefix = random_prompts(5, (70,))[0]
    prompts = [prefix + tail for tail in random_prompts(6, (3, 5, 7))]
    refs = [hf_greedy(hf, p, new) for p in prompts]
    params = SamplingParams(temperature=0, max_new_tokens=new, ignore_eos=True, logprobs=1)
    with Engine(str(folder), backend="mlx", dtype="float32", max_total_tokens=2048) as engine:
        engine.generate([prefix], _greedy(1))
        out = engine.generate(prompts, params)
        assert _tokens(out) == refs
        for p, r in zip(prompts, out, strict=True):
            got = [t.logprob for t in r.logprobs]
            assert got == pytest.approx(_hf_logprobs(hf, p, r.token_ids), abs=1e-4)
        engine.check_invariants(idle=True)


# ---- (1) Phi-3 / Phi-4-mini (fused weights, longrope, partial RoPE), SmolLM3 (NoPE layers) ---

_phi = load_test_module("models/test_phi3_smollm3.py")


@pytest.mark.parametrize("name", ["phi3", "phi4", "smollm3"])
def test_phi3_smollm3_match_transformers(tmp_path_factory, name):
    folder, hf = _build(tmp_path_factory, name, _phi._configs()[name])
    # longrope: transformers runs a prompt past ORIGINAL with the long factors at every position
    # (a whole-call switch): prompts stay within it, their continuations cross it
    lengths = (5, 17, 30, 3) if name != "smollm3" else (5, 17, 60, 3)
    longer_than = _phi.ORIGINAL if name != "smollm3" else 60
    check_family(folder, hf, random_prompts(1, lengths), _phi.NEW, 16, longer_than)


# ---- (2) Mixtral, Qwen3-MoE (experts stacked at load, gathered per token) ------------------

_moe = load_test_module("models/test_moe.py")


def _random_norms(model) -> None:
    """Random norm weights, so a wrong norm mapping shows (as the torch MoE tests do)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "qwen3_moe_step"])
def test_moe_match_transformers(tmp_path_factory, name):
    folder, hf = _build(tmp_path_factory, name, _moe._configs()[name], _random_norms)
    # batched prefill of 70 + 33 + 9 tokens sorts (token, expert) pairs; decode gathers
    check_family(folder, hf, random_prompts(2, (5, 70, 33, 9)), _moe.NEW, 16, 70)


@pytest.mark.parametrize("tokens", [3, 40])  # gathered per token; sorted by expert
def test_quantized_and_stacked_experts_load(tokens):
    """`--quantize` quantizes each expert's matrices; stacked, `mx.gather_qmm` multiplies them
    as `mx.gather_mm` does their dequantized floats, which an already stacked checkpoint
    (transformers 5's in-memory names) gives alike."""
    import mlx.core as mx
    import numpy as np

    from localradix.backends.mlx.moe import MoEBlock
    from localradix.backends.mlx.quant import QuantSpec, quantize
    from localradix.backends.mlx.reader import WeightReader
    from localradix.models import ModelConfig

    c = ModelConfig.from_hf_dict(_moe._configs()["qwen3_moe"].to_dict())  # E 4, H 64, I 32
    rng = np.random.default_rng(0)
    p = "model.layers.0.mlp."
    floats = {p + "gate.weight": rng.normal(size=(4, 64))}
    for e in range(4):
        for part, shape in (
            ("gate_proj", (32, 64)),
            ("up_proj", (32, 64)),
            ("down_proj", (64, 32)),
        ):
            floats[f"{p}experts.{e}.{part}.weight"] = 0.2 * rng.normal(size=shape)
    weights = {k: mx.array(v.astype(np.float32)) for k, v in floats.items()}
    spec = QuantSpec(32, 4)
    packed = {
        k: v if "gate.weight" in k else quantize(v, spec, mx.float32) for k, v in weights.items()
    }
    unpacked = {k: v if "gate.weight" in k else v.dequantize() for k, v in packed.items()}
    x = mx.array(rng.normal(size=(tokens, 64)).astype(np.float32))
    quantized = MoEBlock(c, p, WeightReader(packed, mx.float32))
    assert quantized.gate_up.spec == spec and quantized.down.spec == spec
    want = MoEBlock(c, p, WeightReader(unpacked, mx.float32))(x)
    np.testing.assert_allclose(np.array(quantized(x)), np.array(want), rtol=1e-4, atol=1e-5)
    # the same experts already stacked (transformers 5's in-memory names) give the same
    e = f"{p}experts."
    parts = [[unpacked[f"{e}{i}.{n}.weight"] for i in range(4)] for n in ("gate_proj", "up_proj")]
    stacked = {
        p + "gate.weight": unpacked[p + "gate.weight"],
        e + "gate_up_proj": mx.concatenate([mx.stack(parts[0]), mx.stack(parts[1])], axis=1),
        e + "down_proj": mx.stack([unpacked[f"{e}{i}.down_proj.weight"] for i in range(4)]),
    }
    got = MoEBlock(c, p, WeightReader(stacked, mx.float32))(x)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)


# ---- (3) Gemma 3 (sliding windows, local/global RoPE, (1 + w) norms, GeGLU, soft-cap) -------

_gemma = load_test_module("models/test_gemma3.py")


def _gemma_norms(model) -> None:
    """Gemma norms start at 0 (scale 1): random ones, so (1 + w) shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn_like(p))


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_gemma3_matches_transformers(tmp_path_factory, softcap):
    extra = {} if softcap is None else {"final_logit_softcapping": softcap}
    config = _gemma._hf_config(**extra)
    folder, hf = _build(tmp_path_factory, "gemma3", config, _gemma_norms)
    # cache hits inside the window (4 and 2 tokens of 5 and 3) and far beyond it (29; and
    # 30 + 16 when a prompt runs on into its output); chunks shorter than the window, so
    # windows span chunks
    check_family(folder, hf, random_prompts(1, (5, 17, 30, 3)), _gemma.NEW, 6, 4 * _gemma.WINDOW)
    if softcap is None:
        check_shared_prefix(folder, hf, 8)
    if softcap is not None:  # greedy cannot see a soft-cap: the logprobs do
        check_logprobs(folder, hf, random_prompts(3, (20,))[0], 6)


# ---- (4) gpt-oss (sinks, YaRN, alternating windows, biased clamped-SwiGLU experts) ---------

_oss = load_test_module("models/test_gpt_oss.py")


def test_gpt_oss_matches_transformers(tmp_path_factory):
    folder, hf = _build(tmp_path_factory, "gpt_oss", _oss._hf_config(), _oss._randomise)
    check_family(folder, hf, random_prompts(1, (5, 17, 30, 3)), _oss.NEW, 6, 4 * _oss.WINDOW)
    check_logprobs(folder, hf, random_prompts(3, (20,))[0], 6)
    check_shared_prefix(folder, hf, 8)  # sinks in the cascade's merge


def test_gpt_oss_mxfp4_experts_stay_quantized(tmp_path):
    """OpenAI's MXFP4 expert blocks, multiplied as MLX's mxfp4 without dequantizing: greedy
    tokens equal transformers' with the same experts dequantized."""
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    torch.manual_seed(0)
    hf = transformers.GptOssForCausalLM(_oss._hf_config()).eval()
    _oss._randomise(hf)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    for layer in range(len(_oss.LAYER_TYPES)):
        p = f"model.layers.{layer}.mlp.experts."
        for part, rows, groups in (("gate_up_proj", 64, 2), ("down_proj", 64, 1)):
            blocks = torch.randint(0, 256, (4, rows, groups, 16), generator=gen, dtype=torch.uint8)
            # each group's power of two 2^-8 .. 2^-5: weights of a usual size
            scales = torch.randint(119, 123, (4, rows, groups), generator=gen, dtype=torch.uint8)
            del state[p + part]
            state[f"{p}{part}_blocks"], state[f"{p}{part}_scales"] = blocks, scales
            dense = convert_moe_packed_tensors(blocks, scales).float()
            getattr(hf.model.layers[layer].mlp.experts, part).data.copy_(dense)
    save_file(state, str(tmp_path / "model.safetensors"))
    hf.config.save_pretrained(tmp_path)
    _engine_helpers._word_level_tokenizer(tmp_path)
    prompts = random_prompts(7, (12, 40))
    refs = [hf_greedy(hf, p, 12) for p in prompts]
    with Engine(str(tmp_path), backend="mlx", dtype="float32", max_total_tokens=1024) as engine:
        assert _tokens(engine.generate(prompts, _greedy(12))) == refs
        assert [engine.generate([p], _greedy(12))[0].token_ids for p in prompts] == refs
        engine.check_invariants(idle=True)


# ---- what MLX refuses, by name ------------------------------------------------------------

_qwen3_5 = load_test_module("models/test_qwen3_5.py")


def test_mlx_refuses_only_what_it_lacks(tmp_path):
    from localradix.backends.mlx.runner import mlx_lacks
    from localradix.models import ModelConfig

    families = [_phi._configs()["phi4"], _moe._configs()["qwen3_moe"], _gemma._hf_config()]
    families += [_oss._hf_config()]
    # Qwen3.5, Qwen3.5-MoE, Qwen3-Next: held to transformers in test_mlx_qwen3_5.py
    families += [_qwen3_5._hf_config(f) for f in ("dense", "moe", "next")]
    for config in families:
        assert mlx_lacks(ModelConfig.from_hf_dict(config.to_dict())) == []
    # a Gemma 2-style attention soft-cap on a Gemma 3 checkpoint: named, not silently dropped
    capped = _gemma._hf_config(attn_logit_softcapping=50.0)
    assert mlx_lacks(ModelConfig.from_hf_dict(capped.to_dict())) == [
        "attention logit soft-capping (Gemma 2)"
    ]
    _save(transformers.AutoModelForCausalLM.from_config(capped), tmp_path)
    pattern = (
        r"^the MLX backend does not implement attention logit soft-capping \(Gemma 2\) "
        r"\(Gemma3ForCausalLM\): serve it with --backend cpu .* --backend llamacpp$"
    )
    with pytest.raises(ValueError, match=pattern):
        Engine(str(tmp_path), backend="mlx", dtype="float32", max_total_tokens=512)


def test_gpt_oss_runs_in_bfloat16(tmp_path_factory):
    """Half precision: sinks in q's dtype for SDPA, float experts through MLX's CPU
    `gather_mm` (float32 only) in float32; the hidden states stay bfloat16."""
    folder, _ = _build(tmp_path_factory, "gpt_oss_bf16", _oss._hf_config(), _oss._randomise)
    with Engine(str(folder), backend="mlx", dtype="bfloat16", max_total_tokens=1024) as engine:
        out = engine.generate(random_prompts(1, (5, 70)), _greedy(4))
        assert [len(r.token_ids) for r in out] == [4, 4]
        engine.check_invariants(idle=True)
