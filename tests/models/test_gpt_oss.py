"""gpt-oss (attention sinks, q/k/v/o biases, alternating sliding-window and full layers, YaRN
RoPE, biased experts with a clamped SwiGLU) through the Engine on the CPU backend, greedy token
for token like transformers: alone, batched and cached (hits inside and past the window),
chunked, retracted. Also logits over both attention backends (Triton's in its interpreter),
the attention sinks of the torch-native backend against a float64 reference, the MoE block on
both of its paths and without host syncs, YaRN tables, config parsing and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from engine.conftest import VOCAB, hf_greedy, random_prompts

from localradix.model_api.kv_layout import KVLayout
from localradix.models import ModelConfig
from localradix.step import ForwardBatch
from models.family_parity import (
    check_alone_batched_cached,
    check_chunked,
    check_retraction,
    check_tp_refuses,
    refusing_attention,
    save_checkpoint,
    triton_interpreter,
)

transformers = pytest.importorskip("transformers")

WINDOW = 8
NEW = 24
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
# factor 4 over a 128-token pretraining length: positions past it rotate differently, and the
# cos/sin scale (0.1 ln 4 + 1) shows at every position
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 128,
}


def _hf_config(**extra: object):
    values: dict[str, object] = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=LAYER_TYPES,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        rope_parameters=YARN,
        eos_token_id=1,
        bos_token_id=2,
        pad_token_id=0,
        initializer_range=0.2,  # peaky logits: greedy ties between batched paths are unlikely
        attn_implementation="eager",
    )
    return transformers.GptOssConfig(**{**values, **extra})


def _randomise(model) -> None:
    """transformers starts norms at 1 and biases at 0: random ones, so a mix-up shows; sinks
    large enough to take a real share of each softmax."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.copy_(torch.randn_like(p))


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    """(saved folder, the transformers model in fp32 eval mode)."""
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(_hf_config()).eval()
    _randomise(model)
    return save_checkpoint(tmp_path_factory, "gpt_oss", model)


def test_alone_batched_and_cached_match_transformers(gpt_oss):
    # prompt 2 running on into its own output: a cache hit far longer than the window
    again, (longer,) = check_alone_batched_cached(
        *gpt_oss, random_prompts(1, (5, 17, 30, 24, 3)), NEW, runs_on=[(2, NEW - 6, 6)]
    )
    assert min(r.cached_tokens for r in again) < WINDOW  # hits inside the window, too
    assert longer.cached_tokens > 4 * WINDOW


def test_chunked_prefill_matches(gpt_oss):
    # chunks shorter than the window, so windows span chunks
    check_chunked(*gpt_oss, random_prompts(2, (45, 21, 9)), NEW, chunk=6)


def test_retraction_under_kv_pressure_matches(gpt_oss):
    # 6 x (30 + 24) tokens do not fit: decode must retract
    check_retraction(*gpt_oss, random_prompts(4, (27, 28, 29, 30, 31, 32)), NEW, 200)


def _steps(model, attn, tokens: list[int], prompt: int) -> list[torch.Tensor]:
    """Our logits of `tokens`: the prompt in two extends, then one decode step a token."""
    bounds = [0, prompt // 2, prompt, *range(prompt + 1, len(tokens) + 1)]
    out = []
    with torch.inference_mode():
        for start, end in zip(bounds, bounds[1:], strict=False):
            ids = torch.tensor(tokens[start:end])
            batch = ForwardBatch.build([ids.numpy()], [np.arange(1, end + 1)], [start])
            attn.prepare(batch)
            out.append(model.compute_logits(model(ids, torch.arange(start, end), attn)))
    return out


@pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")
@pytest.mark.parametrize("backend", ["torch_native", "triton"])
def test_logits_match_transformers(gpt_oss, backend):
    """Logits of a prompt (two extends) and decodes past the window, on both backends that
    apply sinks (Triton's kernels in its interpreter here)."""
    from localradix.loader.model_loader import load_model
    from localradix.model_api.attention import get_attention_backend

    if backend == "triton":
        triton_interpreter()
    folder, hf = gpt_oss
    model, config = load_model(str(folder), "float32", "cpu")
    attn = get_attention_backend(backend).from_model_config(config, 64, torch.float32, "cpu")
    assert attn.windows == (WINDOW, 0, WINDOW, 0)
    prompt = random_prompts(5, (13,))[0]
    tokens = [*prompt, *hf_greedy(hf, prompt, 4)]
    with torch.inference_mode():
        want = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(torch.cat(_steps(model, attn, tokens, 13)), want, rtol=0, atol=1e-4)
    if backend == "torch_native":  # the sinks matter: without them the logits move
        for layer in model.layers:
            layer.sinks.zero_()
        without = torch.cat(_steps(model, attn, tokens, 13))
        assert (without - want).abs().max() > 0.01


# ---- attention sinks in the torch-native backend --------------------------------------------

HQ, HKV, D = 4, 2, 8


def _reference(q, k, v, sinks, prefix: int, window: int) -> torch.Tensor:
    """float64: q [E, Hq, D], whole-sequence k/v [S, Hkv, D], sinks [Hq] -> [E, Hq * D]."""
    q, k, v = q.double(), k.double(), v.double()
    k = k.repeat_interleave(HQ // HKV, dim=1)
    v = v.repeat_interleave(HQ // HKV, dim=1)
    scores = torch.einsum("ehd,shd->hes", q, k) / math.sqrt(D)
    keys = torch.arange(k.shape[0])[None, :]
    queries = prefix + torch.arange(q.shape[0])[:, None]
    allowed = (keys <= queries) & ((keys > queries - window) if window else True)
    scores = scores.masked_fill(~allowed, float("-inf"))
    column = sinks.double()[:, None, None].expand(-1, q.shape[0], 1)
    probs = torch.cat([scores, column], dim=-1).softmax(-1)[..., :-1]
    return torch.einsum("hes,shd->ehd", probs, v).reshape(q.shape[0], -1)


class _World:
    """Two layers (windowed, full) with sinks; whole-sequence K/V per request, checked at
    every step against the float64 reference."""

    def __init__(self, windows: tuple[int, int], num_slots: int = 512) -> None:
        from localradix.model_api.attention_spec import AttentionSpec
        from localradix.runner.attention_torch import TorchNativeAttention

        layout = KVLayout(2, HKV, D, "float32", num_slots)
        self.attn = TorchNativeAttention(layout, "cpu", AttentionSpec.of(windows, sinks=True))
        self.windows = windows
        self.gen = torch.Generator().manual_seed(0)
        self.sinks = [2 * torch.randn(HQ, generator=self.gen) for _ in windows]
        self.free = list(np.random.default_rng(0).permutation(np.arange(1, num_slots + 1)))
        self.tables: dict[str, list[int]] = {}
        self.kv: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def fork(self, name: str, parent: str, n: int) -> None:
        """A new request whose first n tokens are `parent`'s, on the same slots (a cache hit)."""
        self.tables[name] = self.tables[parent][:n]
        self.kv[name] = [(k[:n], v[:n]) for k, v in self.kv[parent]]

    def step(self, extends: dict[str, int]) -> None:
        tables, prefixes, ids, new = [], [], [], {}
        for name, n in extends.items():
            table = self.tables.setdefault(name, [])
            prefixes.append(len(table))
            table += [int(self.free.pop()) for _ in range(n)]
            tables.append(np.array(table))
            ids.append(np.zeros(n, dtype=np.int64))
            new[name] = [
                [torch.randn(n, h, D, generator=self.gen) for h in (HQ, HKV, HKV)]
                for _ in self.windows
            ]
        self.attn.prepare(ForwardBatch.build(ids, tables, prefixes))
        for layer, window in enumerate(self.windows):
            q, k, v = (torch.cat([new[n][layer][i] for n in extends]) for i in range(3))
            out = self.attn.forward(q, k, v, layer, 1 / math.sqrt(D), self.sinks[layer])
            start = 0
            for name, prefix in zip(extends, prefixes, strict=True):
                kv = self.kv.setdefault(name, [(torch.zeros(0, HKV, D),) * 2] * len(self.windows))
                q_new, k_new, v_new = new[name][layer]
                kv[layer] = (torch.cat([kv[layer][0], k_new]), torch.cat([kv[layer][1], v_new]))
                want = _reference(q_new, *kv[layer], self.sinks[layer], prefix, window)
                got = out[start : start + len(q_new)].double()
                torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
                start += len(q_new)


@pytest.mark.parametrize("grouped", [None, True])
def test_sinks_match_reference(grouped, monkeypatch):
    from localradix.runner import attention_torch

    monkeypatch.setattr(attention_torch, "GROUPED_WHEN_MASKED", grouped)
    monkeypatch.setattr(attention_torch, "SINK_SCORE_BYTES", 4 * HQ * 40 * 7)  # 7-row chunks
    world = _World((WINDOW, 0))
    world.step({"a": 5, "b": 30})  # no prefix: one within the window, one past it
    world.step({"a": 1})  # one decode on contiguous slots
    world.step({"a": 1, "b": 1})  # decodes of mixed lengths (one inside, one past the window)
    world.step({"a": 20, "b": 1, "c": 3})  # extends over a prefix, mixed with a decode
    world.step({"a": 12})  # a short extend over a prefix longer than the window
    world.step({"a": 40})  # ... and a long one, in chunks
    world.fork("d", "b", 25)  # cache hits longer than the window
    world.fork("e", "b", 28)
    world.step({"d": 6, "e": 1})
    world.step({"a": 1, "b": 1, "d": 1, "e": 1})


def test_sinks_with_shared_prefixes(monkeypatch):
    """Decodes sharing a cached prefix ("cascade"): the sink merges in as one more partial."""
    from localradix.runner import attention_torch

    monkeypatch.setattr(attention_torch, "MIN_SHARED_PREFIX", 4)
    world = _World((12, 0))
    world.step({"root": 40})
    for i, n in enumerate((30, 30, 36)):
        world.fork(f"r{i}", "root", n)
        world.step({f"r{i}": 2})
    for _ in range(2):
        world.step({"r0": 1, "r1": 1, "r2": 1})
        assert any(group.shared for group in world.attn._plans[0][0])


# ---- the experts ---------------------------------------------------------------------------


def _blocks():
    """(transformers' MoE block of layer 0, ours with its weights, loaded as a checkpoint's)."""
    from localradix.models.gpt_oss import GptOssForCausalLM

    torch.manual_seed(0)
    hf_model = transformers.GptOssForCausalLM(_hf_config())
    _randomise(hf_model)
    ours = GptOssForCausalLM(_config())
    ours.load_weights((n, p.detach()) for n, p in hf_model.state_dict().items())
    return hf_model.model.layers[0].mlp.eval(), ours.layers[0].moe


@pytest.mark.parametrize("tokens", [1, 2, 7, 40])
def test_experts_match_transformers_on_both_paths(tokens):
    hf_block, ours = _blocks()
    x = 3 * torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        expected = hf_block(x[None])[0][0]
        weights, ids = ours.route(x)
        for got in (ours._gathered(x, weights, ids), ours._dense(x, weights, ids)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        h = F.linear(x, ours.gate_up_weight.flatten(0, 1), ours.gate_up_bias.flatten())
        assert h.abs().max() > ours.limit  # the clamp is exercised


@pytest.mark.parametrize("tokens", [1, 40])  # a decode step (gathered), a prefill (dense)
def test_experts_make_no_host_sync(tokens):
    from models.test_moe import _syncing_ops

    _, ours = _blocks()
    assert _syncing_ops(ours.forward, torch.randn(tokens, 64)) == []


# ---- RoPE, config, refusals ----------------------------------------------------------------


def _config(**extra: object) -> ModelConfig:
    return ModelConfig.from_hf_dict(_hf_config(**extra).to_dict())


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_tables_match_transformers(truncate):
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    from localradix.models.rotary import RotaryTable

    rope = {**YARN, "truncate": truncate, "rope_theta": 150000.0}
    hf_config = _hf_config(rope_parameters=rope, head_dim=64)
    table = RotaryTable(ModelConfig.from_hf_dict(hf_config.to_dict()), torch.float32, "cpu", 512)
    positions = torch.arange(512)
    cos, sin = GptOssRotaryEmbedding(hf_config)(torch.zeros(1), positions[None])
    ours_cos, ours_sin = table.lookup(positions)
    torch.testing.assert_close(ours_cos[:, 0], torch.cat([cos[0], cos[0]], -1), rtol=0, atol=0)
    torch.testing.assert_close(ours_sin[:, 0, 32:], sin[0], rtol=0, atol=0)


def test_config_parses():
    c = _config()
    assert c.architecture == "GptOssForCausalLM" and c.model_type == "gpt_oss"
    assert c.layer_windows() == (WINDOW, 0, WINDOW, 0) and c.sliding_window is None
    assert c.attention_sinks and c.attention_bias and not c.tie_word_embeddings
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (4, 2, 32)
    assert (c.swiglu_alpha, c.swiglu_limit) == (1.702, 7.0)
    s = c.rope_scaling
    assert (s.rope_type, s.factor, s.original_max_position_embeddings) == ("yarn", 4.0, 128)
    assert s.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    assert (s.beta_fast, s.beta_slow, s.truncate) == (32.0, 1.0, False)
    assert c.rope_theta == 10000.0
    assert {"attention sinks", "mixture of experts", "YaRN RoPE scaling"} <= set(c.extensions())
    assert ModelConfig.from_dict(c.to_dict()) == c
    # a Hub config.json (transformers 4 keys, no layer_types): gpt-oss-20b's RoPE
    hub = {
        "model_type": "gpt_oss",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 4,
        "max_position_embeddings": 131072,
        "rope_theta": 150000,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        "sliding_window": 128,
    }
    c = ModelConfig.from_hf_dict(hub)
    assert c.architecture == "GptOssForCausalLM" and c.layer_windows() == (128, 0, 128, 0)
    assert c.num_experts_per_tok == 4 and c.rope_theta == 150000.0 and c.attention_bias
    assert c.rope_scaling.factor == 32.0 and not c.rope_scaling.truncate
    # no RoPE at all: transformers' default YaRN
    del hub["rope_scaling"], hub["rope_theta"]
    assert ModelConfig.from_hf_dict(hub).rope_scaling == c.rope_scaling


def test_backends_without_sinks_refuse():
    NoSinks = refusing_attention("NoSinks", "applies_sinks")
    with pytest.raises(ValueError, match="NoSinks cannot apply GptOssForCausalLM's attention si"):
        NoSinks.from_model_config(_config(), 64, torch.float32, "cpu")


def _mxfp4(*shape: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 blocks [*shape, 16] and scales [*shape] (powers of two near 1)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (*shape, 16), generator=gen, dtype=torch.uint8)
    return blocks, torch.randint(120, 132, shape, generator=gen, dtype=torch.uint8)


def test_mxfp4_experts_dequantise_like_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from localradix.models.gpt_oss import GptOssForCausalLM, dequantize_mxfp4

    blocks, scales = _mxfp4(3, 10, 4, seed=0)
    want = convert_moe_packed_tensors(blocks, scales)  # [E, G * 32, rows], bfloat16
    assert torch.equal(dequantize_mxfp4(blocks, scales).transpose(1, 2), want)
    # a checkpoint whose experts are MXFP4 loads as one with them dequantised
    hf = transformers.GptOssForCausalLM(_hf_config())
    state = dict(hf.state_dict())
    dense = dict(state)
    for layer in range(len(LAYER_TYPES)):
        p = f"model.layers.{layer}.mlp.experts."
        del state[p + "gate_up_proj"], state[p + "down_proj"]
        for part, rows, groups in (("gate_up_proj", 64, 2), ("down_proj", 64, 1)):
            blocks, scales = _mxfp4(4, rows, groups, seed=layer)
            state[f"{p}{part}_blocks"], state[f"{p}{part}_scales"] = blocks, scales
            dense[p + part] = convert_moe_packed_tensors(blocks, scales).float()
    quantised, plain = GptOssForCausalLM(_config()), GptOssForCausalLM(_config())
    quantised.load_weights(sorted(state.items()))
    plain.load_weights(dense.items())
    for ours, theirs in zip(quantised.parameters(), plain.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    del state["model.layers.0.mlp.experts.down_proj_scales"]
    with pytest.raises(ValueError, match="without their pair: .*layers.0.mlp.experts.down_proj"):
        GptOssForCausalLM(_config()).load_weights(state.items())


def test_tensor_parallel_refuses_gpt_oss():
    check_tp_refuses(_config(), "--tp 2 does not split GptOssForCausalLM")
