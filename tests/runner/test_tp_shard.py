"""Which slice of each weight a tensor-parallel rank holds: together the ranks hold every row
exactly once (KV heads: each rank holds the heads its query heads read), and bad splits and
backends are refused with a clear message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localradix.config import ServerArgs
from localradix.model_api.shard import Shard
from localradix.models.config import ModelConfig
from localradix.platform import Availability, Choice, backend_specs
from localradix.resolve import BackendError, resolve


def _config(heads: int, kv: int, mlp: int, vocab: int, head_dim: int = 8) -> ModelConfig:
    return ModelConfig("LlamaForCausalLM", "llama", vocab, 32, mlp, 2, heads, kv, head_dim, 128)


@st.composite
def _splits(draw: st.DrawFn) -> tuple[ModelConfig, int]:
    size = draw(st.sampled_from([1, 2, 4, 8]))
    heads = size * draw(st.integers(1, 4))
    kv = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    if kv % size and size % kv:
        kv = size  # divides heads, which is a multiple of size
    mlp = size * draw(st.integers(1, 8))
    return _config(heads, kv, mlp, draw(st.integers(size, 300))), size


def _rows(shard: Shard, name: str, config: ModelConfig) -> range:
    piece = shard.weight_slice(name, config)
    assert piece is not None
    return range(piece.start, piece.stop)


@given(_splits())
def test_split_weights_are_covered_once(split: tuple[ModelConfig, int]) -> None:
    config, size = split
    shards = [Shard(r, size) for r in range(size)]
    covered = {
        "model.layers.0.self_attn.q_proj.weight": config.q_size,
        "model.layers.0.self_attn.o_proj.weight": config.q_size,
        "model.layers.0.mlp.gate_proj.weight": config.intermediate_size,
        "model.layers.0.mlp.down_proj.weight": config.intermediate_size,
        "model.embed_tokens.weight": config.vocab_size,
    }
    for name, total in covered.items():
        rows = [i for s in shards for i in _rows(s, name, config)]
        assert rows == list(range(total)), name
    local = shards[0].local_config(config)
    vocab = [s.weight_slice("model.embed_tokens.weight", config) for s in shards]
    assert all(v is not None and v.rows == local.vocab_size for v in vocab)
    assert shards[0].weight_slice("model.layers.0.input_layernorm.weight", config) is None


@given(_splits())
def test_each_rank_holds_the_kv_heads_its_query_heads_read(split: tuple[ModelConfig, int]) -> None:
    config, size = split
    group = config.num_attention_heads // config.num_key_value_heads  # query heads per KV head
    for rank in range(size):
        shard = Shard(rank, size)
        local = shard.local_config(config)
        d = config.head_dim
        q_heads = range(rank * local.num_attention_heads, (rank + 1) * local.num_attention_heads)
        kv_rows = _rows(shard, "model.layers.0.self_attn.k_proj.weight", config)
        kv_heads = range(kv_rows.start // d, kv_rows.stop // d)
        assert len(kv_heads) == local.num_key_value_heads
        assert sorted({h // group for h in q_heads}) == list(kv_heads)


def test_splits_that_do_not_divide_are_refused() -> None:
    with pytest.raises(ValueError, match="--tp 2 cannot split 3 attention heads"):
        Shard(0, 2).check(_config(3, 3, 8, 10))
    with pytest.raises(ValueError, match="6 KV heads"):
        Shard(0, 4).check(_config(12, 6, 8, 10))
    with pytest.raises(ValueError, match="an MLP of 9"):
        Shard(0, 2).check(_config(4, 2, 9, 10))


@pytest.mark.parametrize("backend", ["llamacpp", "mlx"])
def test_tp_on_a_single_device_backend_is_refused(backend: str) -> None:
    choice = Choice(backend_specs()[backend], Availability(True, "faked", "cpu"))
    with pytest.raises(BackendError, match=f"backend '{backend}' cannot honour --tp 2"):
        resolve(choice, ServerArgs(tp=2))
    resolve(choice, ServerArgs(tp=1))  # the default changes nothing


def test_tp_below_one_is_refused() -> None:
    choice = Choice(backend_specs()["cpu"], Availability(True, "faked", "cpu"))
    with pytest.raises(BackendError, match="--tp 0"):
        resolve(choice, ServerArgs(tp=0))
