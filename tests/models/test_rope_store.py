"""The torch reference of `AttentionBackend.rope_store` (q/k norm + RoPE, then the K/V store)
on the torch-native backend, against float64 truth, and `forward(..., stored=True)`."""

from __future__ import annotations

import pytest
import torch

from localradix.model_api.kv_layout import KVLayout
from localradix.runner.attention_torch import TorchNativeAttention
from models.rope_cases import NUM_PAGES, SHAPES, check_store, fill_noise, make_case

# The reference rounds after each op (norm, weight, each RoPE product): a few ulps.
TOL = {torch.float32: 1e-5, torch.float16: 4e-3}
LAYER = 1


def _backend(shape, dtype: torch.dtype, page_size: int) -> TorchNativeAttention:
    slots = NUM_PAGES * page_size - 1
    layout = KVLayout(2, shape.kv_heads, shape.head_dim, str(dtype)[6:], slots, page_size)
    return TorchNativeAttention(layout, "cpu")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("norm", [False, True], ids=["no_norm", "qk_norm"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_reference_rope_store_matches_float64(shape, dtype, norm, page_size):
    case = make_case(shape, dtype, norm, page_size)
    attn = _backend(shape, dtype, page_size)
    attn.prepare(case.batch)
    before = fill_noise(attn, LAYER, 0)
    check_store(attn, case, LAYER, before, TOL[dtype])


def test_a_narrower_cache_gets_the_cast_values():
    shape = SHAPES[1]
    case = make_case(shape, torch.float32, True, 16)
    attn = _backend(shape, torch.float16, 16)
    attn.prepare(case.batch)
    before = fill_noise(attn, LAYER, 0)
    check_store(attn, case, LAYER, before, TOL[torch.float16])


def test_forward_after_rope_store_does_not_store_again():
    shape = SHAPES[0]
    case = make_case(shape, torch.float32, True, 1)
    attn = _backend(shape, torch.float32, 1)
    attn.prepare(case.batch)
    q, k = attn.rope_store(case.qk, case.v, 0, case.cos, case.sin, case.norm_weight, 1e-6)
    stored = attn.k_cache[0].clone(), attn.v_cache[0].clone()
    zeros = torch.zeros_like(k), torch.zeros_like(case.v)
    attn.forward(q, *zeros, 0, 0.25, stored=True)
    assert torch.equal(attn.k_cache[0], stored[0]) and torch.equal(attn.v_cache[0], stored[1])
    attn.forward(q, *zeros, 0, 0.25)  # without `stored`, forward stores
    assert not torch.equal(attn.k_cache[0], stored[0])
