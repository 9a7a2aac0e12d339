"""Mixture of experts: Mixtral and Qwen3-MoE (some layers dense, top-k renormalised or not)
through the Engine on the CPU backend, greedy token for token like transformers: alone, batched
and cached, chunked, retracted. Also the MoE block against transformers' on both of its paths,
no host sync in its forward, the weight names, config parsing and the TP split. (MLX:
tests/backends/test_mlx_families.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from engine.conftest import VOCAB, random_prompts

from localradix.models import ModelConfig
from models.family_parity import (
    check_alone_batched_cached,
    check_chunked,
    check_retraction,
    save_checkpoint,
)

transformers = pytest.importorskip("transformers")

NEW = 24


def _common(layers: int) -> dict[str, object]:
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=1,
        bos_token_id=2,
        pad_token_id=0,
        num_experts_per_tok=2,
        initializer_range=0.2,  # peaky logits: greedy ties between batched paths are unlikely
    )


def _configs() -> dict[str, object]:
    t = transformers
    return {
        "mixtral": t.MixtralConfig(
            **_common(2), intermediate_size=32, num_local_experts=8, sliding_window=None
        ),
        # layer 1 dense (a wider plain MLP), layers 0 and 2 experts; top-k renormalised
        "qwen3_moe": t.Qwen3MoeConfig(
            **_common(3),
            head_dim=16,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_experts=4,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        ),
        # every 2nd layer has experts (layer 0 dense, layer 1 experts); top-k kept as is
        "qwen3_moe_step": t.Qwen3MoeConfig(
            **_common(2),
            intermediate_size=96,
            moe_intermediate_size=24,
            num_experts=6,
            norm_topk_prob=False,
            decoder_sparse_step=2,
        ),
    }


NAMES = list(_configs())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, object]]:
    """name -> (saved folder, the transformers model in fp32 eval mode)."""
    out = {}
    for name, config in _configs().items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():  # random norm weights, so a wrong norm mapping shows
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
        out[name] = save_checkpoint(tmp_path_factory, name, model)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_alone_batched_and_cached_match_transformers(models, name):
    # alone: one-token decode steps take the gathered-experts path; batched: the dense path
    check_alone_batched_cached(*models[name], random_prompts(1, (5, 17, 40, 24, 3)), NEW)


@pytest.mark.parametrize("name", NAMES)
def test_chunked_prefill_matches(models, name):
    check_chunked(*models[name], random_prompts(2, (70, 33, 9)), NEW, chunk=16)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_retraction_under_kv_pressure_matches(models, name):
    # 6 x (30 + 24) tokens do not fit: decode must retract
    check_retraction(*models[name], random_prompts(4, (27, 28, 29, 30, 31, 32)), NEW, 200)


# ---- the block alone -----------------------------------------------------------------------


def _blocks(name: str):
    """(transformers' sparse MoE block, ours with its weights), `name`'s first such layer."""
    from localradix.models.decoder import _Factory
    from localradix.models.moe import MoEBlock

    torch.manual_seed(0)
    config = _config(name)
    first = next(i for i in range(config.num_hidden_layers) if config.uses_moe(i))
    hf_model = transformers.AutoModelForCausalLM.from_config(_configs()[name])
    hf_block = hf_model.model.layers[first].mlp
    ours = MoEBlock(config, _Factory(torch.float32, torch.device("cpu")))
    with torch.no_grad():
        ours.router_weight.copy_(hf_block.gate.weight)
        ours.gate_up_weight.copy_(hf_block.experts.gate_up_proj)
        ours.down_weight.copy_(hf_block.experts.down_proj)
    return hf_block.eval(), ours


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe_step"])
@pytest.mark.parametrize("tokens", [1, 2, 3, 7, 40])
def test_block_matches_transformers_on_both_paths(name, tokens):
    hf_block, ours = _blocks(name)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        expected = hf_block(x[None])[0]
        weights, ids = ours.route(x)
        gathered = ours._gathered(x, weights, ids)
        dense = ours._dense(x, weights, ids)
        got = ours.forward(x)
    torch.testing.assert_close(gathered, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dense, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_dense_path_ignores_an_unselected_expert_that_overflows_in_float16():
    """transformers never runs an expert no token picked; the dense path does, so one whose
    output overflows float16 must not turn the tokens' outputs into NaN."""
    _, ours = _blocks("mixtral")  # 8 experts, top 2: 5 tokens take the dense path
    with torch.no_grad():
        for seed in range(100):  # 5 tokens whose 10 picks leave an expert out
            x = torch.randn(5, 64, generator=torch.Generator().manual_seed(seed))
            weights, ids = ours.route(x)
            unused = [e for e in range(ours.num_experts) if not (ids == e).any()]
            if unused:
                break
        assert x.shape[0] * ours.top_k > ours.num_experts and unused
        want = ours._dense(x, weights, ids)
        unused = unused[0]
        ours.gate_up_weight[unused] = 1e4  # float16 tops out at 65504
        half = ours.half()
        got = half._dense(x.half(), weights, ids)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_router_renormalises_as_configured():
    _, ours = _blocks("qwen3_moe_step")  # norm_topk_prob=False: softmax over all experts
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        weights, ids = ours.route(x)
        assert ids.shape == (9, 2) and bool((weights.sum(-1) < 1).all())
        ours.norm_topk_prob = True
        weights, _ = ours.route(x)
    torch.testing.assert_close(weights.sum(-1), torch.ones(9))


# ---- no host sync --------------------------------------------------------------------------

# op name prefixes (leading "_" dropped): `.item()`, `bool(t)`, `int(t)` reach the host via
# `_local_scalar_dense`; `.tolist()` reads memory without dispatching, so only what made its
# operand shows (`nonzero`, `_unique2`); the rest have data-dependent output shapes
_SYNCING = ("nonzero", "local_scalar_dense", "bincount", "masked_select", "unique")


def _syncing_ops(fn, *args) -> list[str]:
    """Ops run by fn(*args) that need a value on the host (or a data-dependent shape)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    found: list[str] = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__  # e.g. "nonzero.default", "index.Tensor"
            if name.split(".")[0].lstrip("_").startswith(_SYNCING):
                found.append(name)
            if name == "index.Tensor":  # boolean-mask indexing: a data-dependent shape
                if any(i is not None and i.dtype == torch.bool for i in args[1]):
                    found.append("index.Tensor(bool)")
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Spy():
        fn(*args)
    return found


def _looping_forward(block, x: torch.Tensor) -> torch.Tensor:
    """The usual eager MoE (transformers' own loop): only the experts hit, found on the host."""
    weights, ids = block.route(x)
    out = torch.zeros_like(x)
    for e in ids.unique().tolist():
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        gate, up = F.linear(x[token], block.gate_up_weight[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, block.down_weight[e]) * weights[token, slot, None]
        out.index_add_(0, token, y)
    return out


@pytest.mark.parametrize("tokens", [1, 40])  # a decode step (gathered), a prefill (dense)
def test_moe_forward_makes_no_host_sync(tokens):
    hf_block, ours = _blocks("mixtral")
    x = torch.randn(tokens, 64)
    assert _syncing_ops(ours.forward, x) == []
    # ... which the check would see: an expert loop (equal, but syncing), the usual suspects
    with torch.no_grad():
        torch.testing.assert_close(_looping_forward(ours, x), ours.forward(x))
    found = _syncing_ops(_looping_forward, ours, x)
    assert found[0] == "_unique2.default" and "nonzero.default" in found
    assert _syncing_ops(lambda t: t.sum().item(), x) == ["_local_scalar_dense.default"]
    assert "index.Tensor(bool)" in _syncing_ops(lambda t: t[t > 0], x)
    assert _syncing_ops(lambda t: torch.bincount(t.argmax(-1)), x)
    assert _syncing_ops(lambda t: t.masked_select(t > 0), x)


def test_decode_step_of_whole_model_makes_no_host_sync(models):
    """A decode-sized forward of the loaded model (attention prepared outside, as the runner
    does) dispatches no syncing op."""
    import numpy as np

    from localradix.loader.model_loader import load_model
    from localradix.model_api.attention import get_attention_backend
    from localradix.step import ForwardBatch

    folder, _ = models["qwen3_moe"]
    model, _ = load_model(str(folder), dtype=torch.float32, device="cpu")
    attn = get_attention_backend("torch_native").from_model_config(
        model.config, 64, torch.float32, "cpu"
    )
    ids = [np.array([5, 6, 7], dtype=np.int64), np.array([9], dtype=np.int64)]
    batch = ForwardBatch.build(ids, [np.arange(1, 4), np.arange(4, 5)], [0, 0])
    attn.prepare(batch)
    input_ids = torch.from_numpy(batch.input_ids)
    positions = torch.from_numpy(batch.positions)
    assert _syncing_ops(model.forward, input_ids, positions, attn) == []


# ---- weights, config, refusals -------------------------------------------------------------


def _config(name: str) -> ModelConfig:
    return ModelConfig.from_hf_dict(_configs()[name].to_dict())


def test_stacked_expert_weights_load_like_per_expert_ones(models):
    """transformers 5's in-memory names (`mlp.experts.gate_up_proj` [E, 2I, H]) load too."""
    from localradix.models.decoder import DecoderForCausalLM

    for name in ("mixtral", "qwen3_moe"):
        _, hf = models[name]
        config = _config(name)
        ours = DecoderForCausalLM(config)
        ours.load_weights((n, p.detach()) for n, p in hf.state_dict().items())
        layer = ours.layers[0].moe
        assert layer is not None and ours.layers[0].gate_up_weight is None
        experts = hf.model.layers[0].mlp.experts
        torch.testing.assert_close(layer.gate_up_weight, experts.gate_up_proj, rtol=0, atol=0)
        torch.testing.assert_close(layer.down_weight, experts.down_proj, rtol=0, atol=0)
        state = {k: v for k, v in hf.state_dict().items() if "layers.0.mlp.experts.down" not in k}
        with pytest.raises(
            ValueError, match=rf"missing {config.num_experts} weights.*experts\.0\.down_proj"
        ):
            DecoderForCausalLM(config).load_weights(state.items())


def test_configs_parse():
    mixtral, qwen, step = _config("mixtral"), _config("qwen3_moe"), _config("qwen3_moe_step")
    assert mixtral.architecture == "MixtralForCausalLM" and mixtral.num_experts == 8
    assert mixtral.num_experts_per_tok == 2 and mixtral.moe_intermediate_size == 32
    assert mixtral.norm_topk_prob and not mixtral.qk_norm
    assert [mixtral.uses_moe(i) for i in range(2)] == [True, True]
    assert qwen.qk_norm and qwen.norm_topk_prob and qwen.num_experts == 4
    assert (qwen.intermediate_size, qwen.moe_intermediate_size) == (96, 32)
    assert [qwen.uses_moe(i) for i in range(3)] == [True, False, True]
    assert not step.norm_topk_prob and [step.uses_moe(i) for i in range(2)] == [False, True]
    assert "mixture of experts" in qwen.extensions()
    for c in (mixtral, qwen, step):
        assert ModelConfig.from_dict(c.to_dict()) == c
    # a transformers 4 Qwen3-MoE config.json says num_experts (and lists mlp_only_layers)
    d = {**_configs()["qwen3_moe"].to_dict(), "num_experts": 4}
    del d["num_local_experts"]
    assert ModelConfig.from_hf_dict(d) == qwen
    dense = ModelConfig.from_hf_dict(transformers.Qwen3Config(**_common(2)).to_dict())
    assert dense.num_experts == 0 and not dense.uses_moe(0) and not dense.extensions()


def test_tensor_parallel_splits_experts_and_refuses_uneven_widths():
    """(Parity at tp=2 is tests/engine/test_tensor_parallel_moe.py.)"""
    import dataclasses

    from localradix.model_api.shard import Shard

    for name in ("mixtral", "qwen3_moe"):
        config = _config(name)
        Shard(0, 2).check(config)
        assert Shard(1, 2).local_config(config).moe_intermediate_size == (
            config.moe_intermediate_size // 2
        )
        odd = dataclasses.replace(config, moe_intermediate_size=config.moe_intermediate_size + 1)
        with pytest.raises(ValueError, match="cannot split experts of intermediate size"):
            Shard(0, 2).check(odd)
