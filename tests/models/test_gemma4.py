"""Gemma 4 text models through the Engine on the CPU backend, greedy token for token like
transformers: alone, batched and cached (inside and beyond the sliding window), chunked,
retracted; a model with every feature on (sliding windows, a bigger global head with fewer KV
heads, keys as values, KV-shared layers with double-wide MLPs, per-layer inputs, proportional
RoPE, soft-capped logits, random norms and layer scalars) and its MoE variant. Also the mixed
KV layout (shared layers own no KV memory), its host transfer, config parsing, a multimodal
checkpoint's text weights and the backends' refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from engine.conftest import VOCAB, hf_greedy, random_prompts

from localradix.model_api.kv_layout import KVLayout
from localradix.models import ModelConfig
from models.family_parity import (
    check_alone_batched_cached,
    check_chunked,
    check_retraction,
    check_stepped_logits,
    check_tp_refuses,
    refusing_attention,
    save_checkpoint,
    triton_interpreter,
)

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4ForCausalLM"):
    pytest.skip("this transformers has no Gemma 4", allow_module_level=True)

WINDOW = 8
NEW = 20
S, F = "sliding_attention", "full_attention"
LAYER_TYPES = [S, S, F, S, F, S]  # (transformers forces the last to full attention)
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


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    """(saved folder, the transformers model in fp32 eval mode)."""
    return save_checkpoint(tmp_path_factory, "gemma4", _hf_model(0))


@pytest.fixture(scope="module")
def gemma_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    return save_checkpoint(tmp_path_factory, "gemma4_moe", _hf_model(1, **MOE))


def _alone_batched_cached(folder, hf, lengths=(5, 17, 30, 24, 3)) -> None:
    # prompt 2 running on into its own output: a cache hit far longer than the window; prompt
    # 4 (3 tokens): one that ends inside the window
    runs_on = [(2, NEW - 6, 6), (4, 4, 6)]
    _, (longer, short) = check_alone_batched_cached(
        folder, hf, random_prompts(1, lengths), NEW, runs_on
    )
    assert longer.cached_tokens > 4 * WINDOW
    assert short.cached_tokens < WINDOW


def test_alone_batched_and_cached_match_transformers(gemma):
    _alone_batched_cached(*gemma)


def test_moe_alone_batched_and_cached_match_transformers(gemma_moe):
    _alone_batched_cached(*gemma_moe, lengths=(5, 17, 30, 9, 3))


def test_chunked_prefill_matches(gemma):
    # chunks shorter than the window, so windows span chunks
    check_chunked(*gemma, random_prompts(2, (45, 21, 9)), NEW, chunk=6, tail=8)


def test_retraction_under_kv_pressure_matches(gemma):
    # 6 x (30 + 20) tokens do not fit: decode must retract
    check_retraction(*gemma, random_prompts(4, (27, 28, 29, 30, 31, 32)), NEW, 200)


def _logits_match(model, config, hf, make_stepper) -> None:
    check_stepped_logits(make_stepper(model, config), hf, random_prompts(3, (20,))[0], 5.0)


def test_logits_match_transformers(gemma, make_stepper):
    from localradix.loader.model_loader import load_model

    model, config = load_model(str(gemma[0]), "float32", "cpu")
    _logits_match(model, config, gemma[1], make_stepper)


def test_multimodal_checkpoint_text_weights(gemma, make_stepper):
    """A `Gemma4ForConditionalGeneration` config.json and weight names: the text model's under
    `model.language_model.`, the towers skipped."""
    from localradix.models.gemma4 import Gemma4ForCausalLM

    hf = gemma[1]
    text = hf.config.to_dict()
    config = ModelConfig.from_hf_dict(
        {"model_type": "gemma4", "text_config": text, "tie_word_embeddings": True}
    )
    assert config.architecture == "Gemma4ForConditionalGeneration"
    text_only = ModelConfig.from_hf_dict(text)
    assert config == dataclasses.replace(text_only, architecture=config.architecture)
    weights = [
        (n.replace("model.", "model.language_model.", 1), t) for n, t in hf.state_dict().items()
    ]
    weights += [("model.vision_tower.encoder.layers.0.mlp.weight", torch.zeros(2))]
    weights += [("model.embed_audio.embedding_projection.weight", torch.zeros(2))]
    model = Gemma4ForCausalLM(config, torch.float32, "cpu", 128)
    model.load_weights(weights)
    _logits_match(model, config, hf, make_stepper)


# ---- the mixed KV layout -------------------------------------------------------------------


def _config(**extra: object) -> ModelConfig:
    return ModelConfig.from_hf_dict(_hf_config(**extra).to_dict())


def test_config_parses():
    c = _config()
    g = c.gemma4
    assert g is not None and c.architecture == "Gemma4ForCausalLM" and c.tie_word_embeddings
    assert g.sliding == (True, True, False, True, False, False)  # last layer forced full
    assert c.kv_layers == 4 and g.first_shared == 4 and g.kv_sources == (0, 1, 2, 3, 2, 2)
    assert c.kv_layer_shapes == ((2, 16), (2, 16), (1, 32), (2, 16))
    assert c.layer_windows() == (WINDOW, WINDOW, 0, WINDOW)  # per KV layer
    assert g.global_head_dim == 32 and g.global_kv_heads == 1 and g.k_eq_v
    assert g.per_layer_size == 8 and g.double_wide_mlp and c.final_logit_softcap == 5.0
    assert g.global_rope.rope_type == "proportional" and g.global_rope.partial == 0.5
    assert g.local_rope.theta == 100.0 and c.local_rope_theta == 100.0
    assert c.embed_scale == 8.0 and c.num_experts == 0
    assert "Gemma 4 per-layer head sizes, shared KV and inputs" in c.extensions()
    assert ModelConfig.from_dict(c.to_dict()) == c
    # a Hub config.json: global_head_dim / num_global_key_value_heads keys, default RoPE
    hub = {k: v for k, v in _hf_config().to_dict().items() if k != "per_layer_config"}
    hub |= {"global_head_dim": 32, "num_global_key_value_heads": 1, "rope_parameters": None}
    h = ModelConfig.from_hf_dict(hub)
    assert h.kv_layer_shapes == c.kv_layer_shapes and h.gemma4 is not None
    assert h.gemma4.global_rope.partial == 0.25 and h.rope_theta == 1e6
    del hub["architectures"]
    assert ModelConfig.from_hf_dict(hub).architecture == "Gemma4ForCausalLM"
    m = _config(**MOE)
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (4, 2, 24)


def test_mixed_layout_and_its_transfer():
    """KV-shared layers own no KV memory; full layers' bigger heads do; the host transfer of
    slots round-trips through every group."""
    from localradix.runner.attention_torch import TorchNativeAttention
    from localradix.runner.torch_runner import _kv_transfer

    c = _config()
    layout = KVLayout.for_model(c, "float32")
    assert layout.layers == 4 and not layout.uniform
    assert layout.groups == ((2, 16, (0, 1, 3)), (1, 32, (2,)))
    assert layout.bytes_per_token == 4 * 2 * (3 * 2 * 16 + 1 * 32)
    assert layout.layer_bytes_per_token == 4 * 2 * 2 * 16
    assert (
        layout.describe_layers()
        == "3 layers x 2 KV heads x 16 dims + 1 layers x 1 KV heads x 32 dims"
    )
    attn = TorchNativeAttention.from_model_config(c, 16, torch.float32, "cpu")
    assert attn.windows == (WINDOW, WINDOW, 0, WINDOW)
    assert [tuple(k.shape) for k in attn.k_cache] == [(17, 2, 16)] * 2 + [(17, 1, 32), (17, 2, 16)]
    assert sum(k.nbytes + v.nbytes for k, v in attn.kv_groups) == 17 * layout.bytes_per_token
    for k, v in attn.kv_groups:
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
    transfer = _kv_transfer(attn)
    assert transfer is not None and transfer.bytes_per_token == layout.bytes_per_token
    slots = np.array([3, 7, 9])
    rows = transfer.read(slots)
    assert rows.shape == (3, layout.bytes_per_token)
    before = [(k[:, slots].clone(), v[:, slots].clone()) for k, v in attn.kv_groups]
    for k, v in attn.kv_groups:
        k.zero_()
        v.zero_()
    transfer.write(np.zeros(0), np.array([1, 2, 4]), [rows[:2], rows[2:]])
    for (k, v), (k0, v0) in zip(attn.kv_groups, before, strict=True):
        torch.testing.assert_close(k[:, [1, 2, 4]], k0, rtol=0, atol=0)
        torch.testing.assert_close(v[:, [1, 2, 4]], v0, rtol=0, atol=0)


def test_backends_without_mixed_shapes_refuse():
    Uniform = refusing_attention("Uniform", "applies_mixed_shapes")
    with pytest.raises(ValueError, match="Uniform cannot hold Gemma4ForCausalLM's KV layers of"):
        Uniform.from_model_config(_config(), 64, torch.float32, "cpu")
    # without a global head size of its own, the layout is uniform: any windowed backend serves
    same = _config(global_head_dim=16, num_global_key_value_heads=2)
    assert KVLayout.for_model(same, "float32").uniform
    Uniform.from_model_config(same, 64, torch.float32, "cpu")


def test_tensor_parallel_refuses_gemma4():
    check_tp_refuses(_config(), "--tp 2 does not split Gemma4ForCausalLM")


@pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")
def test_triton_attention_holds_the_mixed_layout(gemma):
    """The Triton backend (its interpreter here) keeps one cache per KV shape, applies the
    windows, and its logits equal transformers' over a prompt and decodes past the window."""
    triton_attention = triton_interpreter()
    from localradix.loader.model_loader import load_model
    from localradix.step import ForwardBatch

    model, config = load_model(str(gemma[0]), "float32", "cpu")
    attn = triton_attention.TritonAttention.from_model_config(config, 64, torch.float32, "cpu")
    assert attn.windows == (WINDOW, WINDOW, 0, WINDOW) and len(attn.kv_groups) == 2
    ref = gemma[1]
    prompt = random_prompts(5, (11,))[0]
    tokens = [*prompt, *hf_greedy(ref, prompt, 3)]
    with torch.inference_mode():
        want = ref(torch.tensor([tokens])).logits[0]
        for start, end in ((0, len(prompt)), *((n, n + 1) for n in range(len(prompt), 14))):
            ids = torch.tensor(tokens[start:end])  # a prefill, then decodes past the window
            batch = ForwardBatch.build([ids.numpy()], [np.arange(1, end + 1)], [start])
            attn.prepare(batch)
            ours = model.compute_logits(model(ids, torch.arange(start, end), attn))
            torch.testing.assert_close(ours, want[start:end], rtol=1e-4, atol=1e-4)


def test_disk_tier_evicts_and_restarts_with_parity(gemma, tmp_path):
    """KV of mixed shapes demoted to the disk tier and loaded back, also after a restart."""
    from engine.test_kv_tiers_real import _evict_then_restart

    _evict_then_restart(*gemma, tmp_path)
