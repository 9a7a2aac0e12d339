"""Gemma 3 text models ((1 + w) norms, four a layer, GeGLU, scaled embeddings, sliding-window
layers with their own RoPE) through the Engine on the CPU backend, greedy token for token like
transformers: alone, batched and cached, chunked, retracted. Also the windowed torch-native
attention against a float64 reference, config parsing and the backends' refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from engine.conftest import VOCAB, _word_level_tokenizer, hf_greedy, random_prompts

from localradix.model_api.kv_layout import KVLayout
from localradix.models import ModelConfig
from localradix.step import ForwardBatch
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

WINDOW = 8
NEW = 24
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
LAYER_TYPES += ["full_attention"]


def _hf_config(**extra: object):
    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,  # not head_dim: a wrong attention scale shows
        sliding_window=WINDOW,
        layer_types=LAYER_TYPES,
        max_position_embeddings=512,
        # very different local and global RoPE (the global one scaled): a mix-up shows
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        },
        eos_token_id=1,
        bos_token_id=2,
        pad_token_id=0,
        initializer_range=0.2,  # peaky logits: greedy ties between batched paths are unlikely
        attn_implementation="eager",
        **extra,
    )


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    """(saved folder, the transformers model in fp32 eval mode)."""
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(_hf_config()).eval()
    with torch.no_grad():  # Gemma norms start at 0 (scale 1): random ones, so (1 + w) shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn_like(p))
    return save_checkpoint(tmp_path_factory, "gemma3", model)


def test_alone_batched_and_cached_match_transformers(gemma):
    # prompt 2 running on into its own output: a cache hit far longer than the window
    _, (longer,) = check_alone_batched_cached(
        *gemma, random_prompts(1, (5, 17, 30, 24, 3)), NEW, runs_on=[(2, NEW - 6, 6)]
    )
    assert longer.cached_tokens > 4 * WINDOW


def test_chunked_prefill_matches(gemma):
    # chunks shorter than the window, so windows span chunks
    check_chunked(*gemma, random_prompts(2, (45, 21, 9)), NEW, chunk=6, tail=8)


def test_retraction_under_kv_pressure_matches(gemma):
    # 6 x (30 + 24) tokens do not fit: decode must retract
    check_retraction(*gemma, random_prompts(4, (27, 28, 29, 30, 31, 32)), NEW, 200)


def test_logits_and_final_softcap_match_transformers(tmp_path, make_stepper):
    """Whole-prompt then decode logits, with a final-logit soft-cap (which greedy cannot see)."""
    from localradix.loader.model_loader import load_model

    torch.manual_seed(1)
    hf = transformers.Gemma3ForCausalLM(_hf_config(final_logit_softcapping=3.0)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    _word_level_tokenizer(tmp_path)
    model, config = load_model(str(tmp_path), "float32", "cpu")
    assert config.final_logit_softcap == 3.0
    prompt = random_prompts(3, (20,))[0]
    check_stepped_logits(make_stepper(model, config), hf, prompt, softcap=3.0)


# ---- the windowed torch-native attention ---------------------------------------------------

HQ, HKV, D = 4, 2, 8


def _reference(q, k, v, prefix: int, window: int) -> torch.Tensor:
    """float64: q [E, Hq, D], whole-sequence k/v [S, Hkv, D] -> [E, Hq * D]."""
    q, k, v = q.double(), k.double(), v.double()
    k = k.repeat_interleave(HQ // HKV, dim=1)
    v = v.repeat_interleave(HQ // HKV, dim=1)
    scores = torch.einsum("ehd,shd->hes", q, k) / math.sqrt(D)
    keys = torch.arange(k.shape[0])[None, :]
    queries = prefix + torch.arange(q.shape[0])[:, None]
    allowed = (keys <= queries) & ((keys > queries - window) if window else True)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hes,shd->ehd", scores.softmax(-1), v).reshape(q.shape[0], -1)


class _World:
    """Two layers (windowed, full); whole-sequence K/V per request, checked at every step."""

    def __init__(self, windows: tuple[int, int], num_slots: int = 512) -> None:
        from localradix.model_api.attention_spec import AttentionSpec
        from localradix.runner.attention_torch import TorchNativeAttention

        layout = KVLayout(2, HKV, D, "float32", num_slots)
        self.windows = windows
        self.attn = TorchNativeAttention(layout, "cpu", AttentionSpec.of(windows))
        slots = np.arange(1, num_slots + 1)
        self.free = list(np.random.default_rng(0).permutation(slots))
        self.k: dict[str, list[torch.Tensor]] = {}
        self.v: dict[str, list[torch.Tensor]] = {}
        self.tables: dict[str, list[int]] = {}
        self.gen = torch.Generator().manual_seed(0)

    def fork(self, name: str, parent: str, n: int) -> None:
        """A new request whose first n tokens are `parent`'s, on the same slots (a cache hit)."""
        self.tables[name] = self.tables[parent][:n]
        self.k[name] = [k[:n] for k in self.k[parent]]
        self.v[name] = [v[:n] for v in self.v[parent]]

    def step(self, extends: dict[str, int]) -> None:
        tables, prefixes, ids, new = [], [], [], {}
        for name, n in extends.items():
            table = self.tables.setdefault(name, [])
            prefixes.append(len(table))
            table += [int(self.free.pop()) for _ in range(n)]
            tables.append(np.array(table))
            ids.append(np.zeros(n, dtype=np.int64))
            new[name] = [
                tuple(torch.randn(n, h, D, generator=self.gen) for h in (HQ, HKV, HKV))
                for _ in self.windows
            ]
        batch = ForwardBatch.build(ids, tables, prefixes)
        self.attn.prepare(batch)
        for layer, window in enumerate(self.windows):
            q, k, v = (torch.cat([new[n][layer][i] for n in extends]) for i in range(3))
            out = self.attn.forward(q, k, v, layer, 1 / math.sqrt(D))
            start = 0
            for name, prefix in zip(extends, prefixes, strict=True):
                e = extends[name]
                ks = self.k.setdefault(name, [torch.zeros(0, HKV, D)] * len(self.windows))
                vs = self.v.setdefault(name, [torch.zeros(0, HKV, D)] * len(self.windows))
                ks[layer] = torch.cat([ks[layer], new[name][layer][1]])
                vs[layer] = torch.cat([vs[layer], new[name][layer][2]])
                ref = _reference(new[name][layer][0], ks[layer], vs[layer], prefix, window)
                torch.testing.assert_close(out[start : start + e].double(), ref, atol=1e-5, rtol=0)
                start += e


@pytest.mark.parametrize("grouped", [None, True])
def test_windowed_attention_matches_reference(grouped, monkeypatch):
    from localradix.runner import attention_torch

    monkeypatch.setattr(attention_torch, "GROUPED_WHEN_MASKED", grouped)
    world = _World((WINDOW, 0))
    world.step({"a": 5, "b": 30})  # no prefix: one within the window, one past it
    world.step({"a": 1, "b": 1})  # decodes of mixed lengths (one inside, one past the window)
    world.step({"a": 20, "b": 1, "c": 3})  # extends over a prefix, mixed with a decode
    world.step({"a": 12})  # one extend over a prefix longer than the window (SMALL_EXTEND)
    world.step({"a": 40})  # ... and a long one (SDPA)
    world.fork("d", "b", 25)  # cache hits longer than the window
    world.fork("e", "b", 28)
    world.step({"d": 6, "e": 1})
    world.step({"a": 1, "b": 1, "d": 1, "e": 1})


def test_windowed_decode_with_shared_prefixes(monkeypatch):
    """Decodes sharing a cached prefix ("cascade"), whose windows cut into that prefix."""
    from localradix.runner import attention_torch

    monkeypatch.setattr(attention_torch, "MIN_SHARED_PREFIX", 4)
    world = _World((12, 0))
    world.step({"root": 40})
    for i, n in enumerate((30, 30, 36)):
        world.fork(f"r{i}", "root", n)
        world.step({f"r{i}": 2})
    for _ in range(3):
        world.step({"r0": 1, "r1": 1, "r2": 1})
        # r0 and r1 (same length) share the part of root inside their windows
        assert any(group.shared for group in world.attn._plans[12][0])


# ---- config, refusals ----------------------------------------------------------------------


def _config(**extra: object) -> ModelConfig:
    return ModelConfig.from_hf_dict(_hf_config(**extra).to_dict())


def test_config_parses():
    c = _config()
    assert c.architecture == "Gemma3ForCausalLM" and c.tie_word_embeddings
    assert c.layer_windows() == (WINDOW, 0, WINDOW, WINDOW, 0)
    assert c.rope_theta == 10000.0 and c.local_rope_theta == 100.0
    assert c.rope_scaling.rope_type == "linear" and c.rope_scaling.factor == 4.0
    assert c.query_pre_attn_scalar == 24 and c.embed_scale == 8.0 and c.offset_norms
    assert c.hidden_act == "gelu_pytorch_tanh" and c.sliding_window is None
    assert "sliding-window attention layers" in c.extensions()
    assert ModelConfig.from_dict(c.to_dict()) == c
    # transformers 4's keys (a Hub config.json): sliding_window_pattern, rope_local_base_freq
    old = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 512,
        "sliding_window_pattern": 3,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    c = ModelConfig.from_hf_dict(old)
    assert c.layer_windows() == (512, 512, 0, 512, 512, 0)
    assert c.rope_theta == 1e6 and c.local_rope_theta == 1e4 and c.rope_scaling.factor == 8.0
    assert c.tie_word_embeddings and c.hidden_act == "gelu_pytorch_tanh"
    # model_type alone names the architecture
    del old["architectures"]
    assert ModelConfig.from_hf_dict(old).architecture == "Gemma3ForCausalLM"


def test_rotary_tables_match_transformers():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    from localradix.models.gemma3 import Gemma3ForCausalLM

    model = Gemma3ForCausalLM(_config(), torch.float32, "cpu", max_positions=64)
    hf = Gemma3RotaryEmbedding(_hf_config())
    positions = torch.arange(64)
    for kind, table in (
        ("full_attention", model.rotary),
        ("sliding_attention", model.local_rotary),
    ):
        cos, sin = hf(torch.zeros(1), positions[None], kind)
        ours_cos, ours_sin = table.lookup(positions)
        torch.testing.assert_close(ours_cos[:, 0], cos[0], rtol=0, atol=0)
        torch.testing.assert_close(ours_sin[:, 0, 8:], sin[0, :, 8:], rtol=0, atol=0)


def test_backends_without_windows_refuse():
    from localradix.model_api.attention import AttentionBackend
    from localradix.runner.attention_torch import TorchNativeAttention

    NoWindows = refusing_attention("NoWindows", "applies_windows")
    config = _config()
    with pytest.raises(ValueError, match="NoWindows cannot apply Gemma3ForCausalLM's sliding"):
        NoWindows.from_model_config(config, 64, torch.float32, "cpu")
    attn = TorchNativeAttention.from_model_config(config, 64, torch.float32, "cpu")
    assert isinstance(attn, AttentionBackend) and attn.windows == (WINDOW, 0, WINDOW, WINDOW, 0)


def test_tensor_parallel_refuses_gemma():
    check_tp_refuses(_config(), "--tp 2 does not split Gemma3ForCausalLM")


@pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")
def test_triton_attention_gets_the_windows(gemma):
    """The Triton backend (its interpreter here) is given the model's windows and its logits
    equal the torch-native backend's, over a prompt and decodes past the window."""
    triton_attention = triton_interpreter()
    from localradix.loader.model_loader import load_model

    model, config = load_model(str(gemma[0]), "float32", "cpu")
    attn = triton_attention.TritonAttention.from_model_config(config, 64, torch.float32, "cpu")
    assert attn.windows == (WINDOW, 0, WINDOW, WINDOW, 0)
    ref = gemma[1]
    prompt = random_prompts(5, (13,))[0]
    tokens = [*prompt, *hf_greedy(ref, prompt, 3)]
    with torch.inference_mode():
        want = ref(torch.tensor([tokens])).logits[0]
        for start, end in ((0, len(prompt)), *((n, n + 1) for n in range(len(prompt), 16))):
            ids = torch.tensor(tokens[start:end])  # a prefill, then decodes past the window
            batch = ForwardBatch.build([ids.numpy()], [np.arange(1, end + 1)], [start])
            attn.prepare(batch)
            ours = model.compute_logits(model(ids, torch.arange(start, end), attn))
            torch.testing.assert_close(ours, want[start:end], rtol=1e-4, atol=1e-4)
