"""Gemma 4 text models on the MLX backend, greedy token for token like transformers (float32):
alone, batched, from cache hits inside and beyond the sliding window, chunked prefill, decodes
on a shared cached prefix (with logprobs, which see the soft-cap), dense and MoE. The tiny model
has every feature on (sliding windows, a bigger global head with fewer KV heads, keys as
values, KV-shared layers with double-wide MLPs, per-layer inputs, proportional RoPE, random
norms and layer scalars), as tests/models/test_gemma4.py's. Also the disk tier and the host
transfer of the mixed KV layout, and the logits of a multimodal checkpoint's text weights."""

from __future__ import annotations

import numpy as np
import pytest

from localradix import Engine, SamplingParams

from .conftest import VOCAB, hf_greedy, load_test_module, random_prompts, requires_mlx
from .test_mlx_families import check_retraction

pytestmark = requires_mlx
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
if not hasattr(transformers, "Gemma4ForCausalLM"):
    pytest.skip("this transformers has no Gemma 4", allow_module_level=True)
_engine_helpers = load_test_module("engine/conftest.py")

WINDOW = 8
NEW = 20
S, F = "sliding_attention", "full_attention"
LAYER_TYPES = [S, S, F, S, S, F]  # KV-shared: layer 4 reads layer 3's K/V, layer 5 layer 2's
MOE = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 24}


def _hf_config(**extra: object):
    values: dict[str, object] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": len(LAYER_TYPES),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 32,  # full-attention layers: bigger heads ...
        "num_global_key_value_heads": 1,  # ... and fewer KV heads (with attention_k_eq_v)
        "attention_k_eq_v": True,
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": VOCAB,
        "sliding_window": WINDOW,
        "layer_types": LAYER_TYPES,
        "final_logit_softcapping": 5.0,
        "max_position_embeddings": 512,
        "rope_parameters": {  # very different local and global RoPE: a mix-up shows
            S: {"rope_type": "default", "rope_theta": 100.0},
            F: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1e4},
        },
        "eos_token_id": 1,
        "bos_token_id": 2,
        "pad_token_id": 0,
        "initializer_range": 0.2,  # peaky logits: greedy ties between batched paths are unlikely
        "attn_implementation": "eager",
    }
    return transformers.Gemma4TextConfig(**{**values, **extra})


def _hf_model(seed: int, **extra: object):
    torch.manual_seed(seed)
    model = transformers.Gemma4ForCausalLM(_hf_config(**extra)).eval()
    with torch.no_grad():  # norms, scales and layer scalars start at 1: random ones show
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("norm.weight", "router.scale", "per_expert_scale", "layer_scalar")):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model


def _saved(tmp_path_factory: pytest.TempPathFactory, name: str, model) -> tuple[object, object]:
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    _engine_helpers._word_level_tokenizer(folder)
    return folder, model


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    """(saved folder, the transformers model in fp32 eval mode)."""
    return _saved(tmp_path_factory, "gemma4", _hf_model(0))


@pytest.fixture(scope="module")
def gemma_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    return _saved(tmp_path_factory, "gemma4_moe", _hf_model(1, **MOE))


def _greedy(n: int, **extra: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True, **extra)


def _tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def _engine(folder, **extra: object) -> Engine:
    return Engine(str(folder), backend="mlx", dtype="float32", max_total_tokens=4096, **extra)


def _alone_batched_cached(folder, hf, lengths) -> None:
    prompts = random_prompts(1, lengths)
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with _engine(folder) as engine:
        assert [engine.generate([p], _greedy(NEW))[0].token_ids for p in prompts] == refs
        again = engine.generate(prompts, _greedy(NEW))  # batched, every prompt now cached
        assert _tokens(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts, strict=True))
        # a prompt running on into its own output: a cache hit far longer than the window
        k = NEW - 6
        longer = engine.generate([prompts[2] + refs[2][:k]], _greedy(6))[0]
        assert longer.token_ids == refs[2][k:] and longer.cached_tokens > 4 * WINDOW
        # ... and one that ends inside the window
        short = engine.generate([prompts[4] + refs[4][:4]], _greedy(6))[0]
        assert short.token_ids == refs[4][4:10] and short.cached_tokens < WINDOW
        engine.check_invariants(idle=True)


def _chunked(folder, hf) -> None:
    prompts = random_prompts(2, (45, 21, 9))
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with _engine(folder, chunked_prefill_size=6) as engine:  # windows span chunks
        assert _tokens(engine.generate(prompts, _greedy(NEW))) == refs
        k = NEW - 8
        longer = [p + r[:k] for p, r in zip(prompts, refs, strict=True)]
        engine.flush_cache()
        assert _tokens(engine.generate(longer, _greedy(8))) == [r[k:] for r in refs]
        engine.check_invariants(idle=True)


def _hf_logprobs(hf, prompt: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)[torch.arange(len(tokens)), tokens].tolist()


def _shared_prefix(folder, hf, new: int = 8) -> None:
    """Decodes together on a cached 70-token prefix: full-attention layers attend to it once
    for the group (cascade, per layer shape), windowed ones see only their window; the
    logprobs equal transformers' (greedy tokens alone cannot see the soft-cap)."""
    prefix = random_prompts(5, (70,))[0]
    prompts = [prefix + tail for tail in random_prompts(6, (3, 5, 7))]
    refs = [hf_greedy(hf, p, new) for p in prompts]
    with _engine(folder) as engine:
        engine.generate([prefix], _greedy(1))
        out = engine.generate(prompts, _greedy(new, logprobs=1))
        assert _tokens(out) == refs
        for p, r in zip(prompts, out, strict=True):
            got = [t.logprob for t in r.logprobs]
            assert got == pytest.approx(_hf_logprobs(hf, p, r.token_ids), abs=1e-4)
        engine.check_invariants(idle=True)


def test_matches_transformers(gemma):
    _alone_batched_cached(*gemma, lengths=(5, 17, 30, 24, 3))
    _chunked(*gemma)
    _shared_prefix(*gemma)
    check_retraction(*gemma, random_prompts(2, (20, 35, 12)), 10)


def test_moe_matches_transformers(gemma_moe):
    # batched prefill sorts (token, expert) pairs by expert; decode gathers per token
    _alone_batched_cached(*gemma_moe, lengths=(5, 17, 30, 9, 3))


def test_disk_tier_evicts_and_restarts_with_parity(gemma, tmp_path):
    """KV of mixed shapes demoted to the disk tier through the MLX transfer and loaded back,
    also after a restart."""
    from engine.test_kv_tiers_real import _evict_then_restart

    _evict_then_restart(*gemma, tmp_path, backend="mlx")


def test_multimodal_checkpoint_text_weights_logits(gemma):
    """A `Gemma4ForConditionalGeneration` checkpoint's names (text under
    `model.language_model.`, towers beside it): prefill then decode logits equal
    transformers' past the window, through the mixed-shape paged attention."""
    import mlx.core as mx

    from localradix.backends.mlx.attention import MLXPagedAttention
    from localradix.backends.mlx.gemma4 import MLXGemma4ForCausalLM
    from localradix.model_api.attention_spec import AttentionSpec
    from localradix.model_api.kv_layout import KVLayout
    from localradix.models import ModelConfig
    from localradix.step import ForwardBatch

    hf = gemma[1]
    config = ModelConfig.from_hf_dict(
        {"model_type": "gemma4", "text_config": hf.config.to_dict(), "tie_word_embeddings": True}
    )
    weights = {
        n.replace("model.", "model.language_model.", 1): mx.array(t.numpy())
        for n, t in hf.state_dict().items()
    }
    weights["model.vision_tower.encoder.layers.0.mlp.weight"] = mx.zeros(2)
    model = MLXGemma4ForCausalLM(config, weights, mx.float32)
    layout = KVLayout.for_model(config, "float32", 64)
    attn = MLXPagedAttention(layout, mx.float32, AttentionSpec.for_model(config, layout.layers))
    prompt = random_prompts(5, (11,))[0]
    tokens = [*prompt, *hf_greedy(hf, prompt, 4)]
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0].numpy()
    assert len(attn.k_cache) == 4 and attn.k_cache[2].shape == (65, 1, 32)  # shared: none
    for start, end in ((0, len(prompt)), *((n, n + 1) for n in range(len(prompt), 15))):
        ids = np.array(tokens[start:end])  # a prefill, then decodes past the window
        attn.prepare(ForwardBatch.build([ids], [np.arange(1, end + 1)], [start]))
        hidden = model.forward(mx.array(ids), mx.arange(start, end), attn)
        got = np.array(model.compute_logits(hidden))
        np.testing.assert_allclose(got, want[start:end], rtol=1e-4, atol=1e-4)


def test_mixed_kv_layout_transfer_round_trips():
    """Layers of two KV shapes: a token's row is each group's K then V (as on torch), its size
    the layout's bytes per token, and it writes back where it came from."""
    import mlx.core as mx

    from localradix.backends.mlx.attention import MLXPagedAttention
    from localradix.backends.mlx.kv_transfer import MLXKVTransfer
    from localradix.backends.mlx.runner import mlx_lacks
    from localradix.model_api.attention_spec import AttentionSpec
    from localradix.model_api.kv_layout import KVLayout
    from localradix.models import ModelConfig

    config = ModelConfig.from_hf_dict(_hf_config().to_dict())
    assert mlx_lacks(config) == []
    layout = KVLayout.for_model(config, "float32", 16)
    attn = MLXPagedAttention(layout, mx.float32, AttentionSpec.for_model(config, layout.layers))
    for caches in (attn.k_cache, attn.v_cache):
        for i, cache in enumerate(caches):
            caches[i] = mx.random.normal(cache.shape)
    transfer = MLXKVTransfer(attn, mx.cpu)
    assert transfer.bytes_per_token == layout.bytes_per_token == 4 * 2 * (3 * 2 * 16 + 32)
    slots = np.array([3, 7, 9])
    rows = transfer.read(slots)
    assert rows.shape == (3, layout.bytes_per_token)
    k0 = np.array(attn.k_cache[1][mx.array(slots)])  # the first group's second layer
    first = rows[:, 2 * 16 * 4 : 2 * 2 * 16 * 4].view(np.float32).reshape(3, 2, 16)
    np.testing.assert_array_equal(first, k0)
    before = [np.array(c[mx.array(slots)]) for c in attn.k_cache + attn.v_cache]
    for caches in (attn.k_cache, attn.v_cache):
        for i, cache in enumerate(caches):
            caches[i] = mx.zeros_like(cache)
    transfer.write(np.zeros(0), np.array([1, 2, 4]), [rows[:2], rows[2:]])
    after = [np.array(c[mx.array([1, 2, 4])]) for c in attn.k_cache + attn.v_cache]
    for a, b in zip(after, before, strict=True):
        np.testing.assert_array_equal(a, b)


def _as_mlx_lm(src, dst, num_layers: int, shared: int, bits: dict | None = None):
    """`src` (a Hugging Face Gemma 4 folder) as mlx-lm saves its conversion (its gemma4
    `sanitize`): names under its VLM wrapper, each layer's stacked experts split into
    `switch_glu` gate / up / down, the KV-shared layers' k/v projections and k-norm dropped;
    with `bits`, every matrix whose rows split into whole groups quantized as mlx-lm packs it."""
    import json
    import shutil

    import mlx.core as mx

    out: dict = {}

    def put(name: str, w) -> None:
        if (
            bits
            and w.ndim >= 2
            and name.endswith("proj.weight")
            and w.shape[-1] % bits["group_size"] == 0
        ):
            q, scales, biases = mx.quantize(w, bits["group_size"], bits["bits"])
            stem = name.removesuffix(".weight")
            out.update({f"{stem}.scales": scales, f"{stem}.biases": biases})
            w = q
        out[name] = w

    for name, w in mx.load(str(src / "model.safetensors")).items():
        layer = int(name.split("layers.")[1].split(".")[0]) if "layers." in name else -1
        if layer >= num_layers - shared and any(
            s in name for s in (".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm")
        ):
            continue
        name = "language_model." + name.replace("model.", "model.", 1)
        if name.endswith(".experts.gate_up_proj"):
            base = name.removesuffix(".gate_up_proj") + ".switch_glu."
            gate, up = mx.split(w, 2, axis=-2)
            put(base + "gate_proj.weight", gate)
            put(base + "up_proj.weight", up)
        elif name.endswith(".experts.down_proj"):
            put(name.removesuffix(".down_proj") + ".switch_glu.down_proj.weight", w)
        else:
            put(name, w)
    dst.mkdir()
    mx.save_safetensors(str(dst / "model.safetensors"), out, metadata={"format": "mlx"})
    for f in src.iterdir():
        if f.suffix == ".json" and f.name != "config.json":
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(
        json.dumps({**config, **({"quantization": bits} if bits else {})})
    )
    return dst


def test_mlx_lm_converted_moe_folders_load(gemma_moe, tmp_path):
    """mlx-lm's layout of a Gemma 4 MoE checkpoint (wrapper names, switch_glu experts, no
    k/v in KV-shared layers) gives transformers' greedy tokens; quantized by 8 bits, it runs
    with its experts packed and still follows the float model for a few tokens."""
    folder, hf = gemma_moe
    config = hf.config
    layers, shared = config.num_hidden_layers, config.num_kv_shared_layers
    prompts = random_prompts(6, (9, 30))
    want = [hf_greedy(hf, p, 6) for p in prompts]
    with _engine(_as_mlx_lm(folder, tmp_path / "float", layers, shared)) as engine:
        assert _tokens(engine.generate(prompts, _greedy(6))) == want
    packed = _as_mlx_lm(folder, tmp_path / "q8", layers, shared, {"group_size": 32, "bits": 8})
    with _engine(packed) as engine:
        experts = engine.core.scheduler.runner.model.blocks[0].moe
        assert experts.gate_up.spec is not None  # (down's 24-wide rows stay float)
        got = _tokens(engine.generate(prompts, _greedy(2)))
    assert got == [w[:2] for w in want]
