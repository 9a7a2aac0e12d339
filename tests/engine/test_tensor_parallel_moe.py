"""Mixture of experts under tensor parallelism on the CPU (gloo, 2 ranks): Mixtral and
Qwen3-MoE (a dense layer among expert ones, top-k renormalised) give transformers' greedy
tokens alone, chunked, batched and cached; every rank holds half of each expert (its
intermediate rows) and all of the router; a rank's forward makes no host sync; experts whose
width does not divide over the ranks are refused before any rank starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from localradix import Engine, SamplingParams
from localradix.loader import load_model
from localradix.model_api.shard import Shard
from localradix.models import ModelConfig
from localradix.runner.torch_runner import resident_bytes

from .conftest import VOCAB, _word_level_tokenizer, hf_greedy, random_prompts, token_lists

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

transformers = pytest.importorskip("transformers")

NEW = 12
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)
# Parameters split across the ranks (experts included); the router and norms are replicated.
SPLIT = ("embed_tokens", "lm_head", "qkv_weight", "o_weight", "gate_up", "down")


def _configs() -> dict[str, object]:
    common = dict(
        vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, eos_token_id=1, bos_token_id=2, pad_token_id=0,
        num_experts_per_tok=2, initializer_range=0.2, tie_word_embeddings=False,
    )  # fmt: skip
    t = transformers
    return {
        "mixtral": t.MixtralConfig(
            **common,
            num_hidden_layers=2,
            intermediate_size=32,
            num_local_experts=8,
            sliding_window=None,
        ),  # fmt: skip
        # layer 1 dense (its own MLP width), layers 0 and 2 experts; top-k renormalised
        "qwen3_moe": t.Qwen3MoeConfig(
            **common,
            num_hidden_layers=3,
            head_dim=16,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_experts=4,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        ),  # fmt: skip
    }


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    """name -> (saved folder, the transformers model in fp32 eval mode)."""
    out = {}
    for name, config in _configs().items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        folder = tmp_path_factory.mktemp(f"tp-{name}")
        model.save_pretrained(folder)
        _word_level_tokenizer(folder)
        out[name] = (folder, model)
    return out


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_alone_chunked_batched_and_cached_match_transformers(moe_models, name):
    folder, hf = moe_models[name]
    prompts = random_prompts(3, lengths=(5, 40, 23, 3))
    prompts.append(prompts[1] + [7, 8, 9])  # shares 40 tokens with the second
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(
        str(folder), backend="cpu", dtype="float32", tp=2, max_total_tokens=4096,
        chunked_prefill_size=16,  # prompts of 17+ come in chunks
    ) as engine:  # fmt: skip
        # alone: decode steps of one token take the gathered-experts path
        assert [engine.generate([p], GREEDY)[0].token_ids for p in prompts] == refs
        again = engine.generate(prompts, GREEDY)  # batched (dense path), every prompt cached
        assert token_lists(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts, strict=True))
        engine.check_invariants(idle=True)
        _assert_half_the_experts(folder, engine.core.runner.rank_weight_bytes)


def _assert_half_the_experts(folder: Path, per_rank: tuple[int, ...]) -> None:
    """Each rank: half of every split parameter (half of each expert) plus the replicated."""
    model, _ = load_model(str(folder), dtype="float32")
    total = resident_bytes(model)
    assert total is not None
    params = dict(model.named_parameters())
    split = sum(p.nbytes for n, p in params.items() if any(s in n for s in SPLIT))
    experts = sum(p.nbytes for n, p in params.items() if ".moe." in n and "router" not in n)
    assert experts > total / 4  # a share whose halving shows
    assert per_rank == ((total + (total - split)) // 2,) * 2
    assert max(per_rank) < 0.55 * total


class _OneRankOfTwo:
    """The comm of rank 1 of 2 with no peer: collectives return their argument (shape-true),
    enough to run one rank's slice in-process."""

    rank, size = 1, 2

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x], dim=1)


def test_a_ranks_slice_holds_half_of_each_expert_and_steps_with_no_host_sync(moe_models):
    import numpy as np

    from localradix.model_api.attention import get_attention_backend
    from localradix.step import ForwardBatch

    folder, hf = moe_models["qwen3_moe"]
    model, _ = load_model(str(folder), dtype=torch.float32, tp=_OneRankOfTwo())
    moe, experts = model.layers[2].moe, hf.model.layers[2].mlp.experts  # [E, 2I, H], [E, H, I]
    assert moe is not None and model.layers[1].moe is None
    gate, up = experts.gate_up_proj.chunk(2, dim=1)
    torch.testing.assert_close(moe.gate_up_weight, torch.cat([gate[:, 16:], up[:, 16:]], 1))
    torch.testing.assert_close(moe.down_weight, experts.down_proj[:, :, 16:])
    torch.testing.assert_close(moe.router_weight, hf.model.layers[2].mlp.gate.weight)
    assert model.layers[1].down_weight.shape == (64, 48)  # the dense layer: half its width too
    attn = get_attention_backend("torch_native").from_model_config(
        model.config, 64, torch.float32, "cpu"
    )
    for lengths in ((1,), (1, 1, 1)):  # a decode step of one (gathered) and three (dense)
        ids = [np.array([5 + i], dtype=np.int64) for i in range(len(lengths))]
        batch = ForwardBatch.build(
            ids, [np.array([3 + i]) for i in range(len(ids))], [0] * len(ids)
        )
        attn.prepare(batch)
        args = (torch.from_numpy(batch.input_ids), torch.from_numpy(batch.positions), attn)
        assert _syncing_ops(model.forward, *args) == []
    assert _syncing_ops(lambda t: t.sum().item(), torch.ones(2)) != []  # the check sees syncs


def _syncing_ops(fn, *args) -> list[str]:
    """Ops run by fn(*args) that read a value on the host or make a data-dependent shape."""
    from torch.utils._python_dispatch import TorchDispatchMode

    syncing = ("nonzero", "local_scalar_dense", "bincount", "masked_select", "unique")
    found: list[str] = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0].lstrip("_").startswith(syncing):
                found.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Spy():
        fn(*args)
    return found


def _config(name: str, **changes: object) -> ModelConfig:
    return ModelConfig.from_hf_dict({**_configs()[name].to_dict(), **changes})


def test_expert_weights_slice_by_intermediate_rows_and_the_router_whole():
    shard, c = Shard(1, 2), _config("mixtral")
    local = shard.local_config(c)
    assert (local.moe_intermediate_size, local.num_experts) == (16, 8)
    p = "model.layers.0.block_sparse_moe."
    for part, dim in (("w1", 0), ("w3", 0), ("w2", 1)):  # gate, up: rows; down: columns
        piece = shard.weight_slice(f"{p}experts.7.{part}.weight", c)
        assert piece is not None and (piece.dim, piece.start, piece.stop) == (dim, 16, 32)
    assert shard.weight_slice(p + "gate.weight", c) is None
    q = _config("qwen3_moe")
    piece = shard.weight_slice("model.layers.1.mlp.down_proj.weight", q)  # the dense layer
    assert piece is not None and (piece.dim, piece.start, piece.stop) == (1, 48, 96)
    piece = shard.weight_slice("model.layers.0.mlp.experts.3.up_proj.weight", q)
    assert piece is not None and (piece.dim, piece.start, piece.stop) == (0, 16, 32)
    with pytest.raises(ValueError, match="--tp 2 reads experts saved one by one"):
        shard.weight_slice("model.layers.0.mlp.experts.gate_up_proj", q)


def test_uneven_experts_are_refused_before_any_rank_starts(moe_models, tmp_path):
    from localradix.backends.torch_device import create_torch_runner
    from localradix.config import ServerArgs
    from localradix.resolve import Target
    from localradix.store.source import ModelSource

    folder, _ = moe_models["qwen3_moe"]
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "moe_intermediate_size": 33}))
    args, target = ServerArgs(tp=2), Target("cpu", "cpu", "float32")
    one_line = r"^--tp 2 cannot split experts of intermediate size 33 evenly$"
    with pytest.raises(ValueError, match=one_line):
        create_torch_runner(args, ModelSource(tmp_path, "hf", "odd"), target)
    # Mixtral has no dense layer: only its experts' width is named
    with pytest.raises(ValueError, match=r"split experts of intermediate size 33 evenly$"):
        Shard(0, 2).check(_config("mixtral", intermediate_size=33))
    Shard(0, 1).check(_config("mixtral", intermediate_size=33))
