"""The Triton backend's `rope_store` (q/k norm + RoPE + K/V store, one kernel) under Triton's
CPU interpreter, against float64 truth: outputs, and the cache slot by slot."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from localradix.backends.cuda import triton_attention  # noqa: E402
from localradix.model_api.kv_layout import KVLayout  # noqa: E402

from .conftest import load_test_module  # noqa: E402

if not triton_attention.interpreter_active():  # tests/conftest.py turns it on without a GPU
    pytest.skip("triton runs compiled here (a GPU)", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")
cases = load_test_module("models/rope_cases.py")
# Computed in float32 and rounded once: within an ulp of the truth (bf16 dot is broken in the
# interpreter; nothing here needs a dot, but bf16 caches are covered by the fp16 cast path).
TOL = {torch.float32: 1e-5, torch.float16: 1e-3}
LAYER = 1


def _backend(shape, cache_dtype: torch.dtype, page_size: int) -> triton_attention.TritonAttention:
    slots = cases.NUM_PAGES * page_size - 1
    name = str(cache_dtype).removeprefix("torch.")
    layout = KVLayout(2, shape.kv_heads, shape.head_dim, name, slots, page_size)
    return triton_attention.TritonAttention(layout, "cpu")


@pytest.mark.parametrize("shape", cases.SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("norm", [False, True], ids=["no_norm", "qk_norm"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_fused_rope_store_matches_float64(shape, dtype, norm, page_size):
    case = cases.make_case(shape, dtype, norm, page_size, seed=page_size)
    attn = _backend(shape, dtype, page_size)
    attn.prepare(case.batch)
    before = cases.fill_noise(attn, LAYER, page_size)
    cases.check_store(attn, case, LAYER, before, TOL[dtype])


@pytest.mark.parametrize(
    "dtype, cache_dtype", [(torch.float32, torch.float16), (torch.float16, torch.float32)]
)
def test_the_cache_dtype_may_differ(dtype, cache_dtype):
    shape = cases.SHAPES[1]
    case = cases.make_case(shape, dtype, True, 16)
    attn = _backend(shape, cache_dtype, 16)
    attn.prepare(case.batch)
    before = cases.fill_noise(attn, LAYER, 3)
    cases.check_store(attn, case, LAYER, before, TOL[torch.float16])


def test_fused_and_reference_agree_through_forward():
    """The decoder's two calls, fused and through the base class's torch reference: the same
    attention output."""
    from localradix.model_api.attention import AttentionBackend

    shape = cases.SHAPES[0]
    case = cases.make_case(shape, torch.float32, True, 16)
    outs = []
    for rope_store in (triton_attention.TritonAttention.rope_store, AttentionBackend.rope_store):
        attn = _backend(shape, torch.float32, 16)
        attn.prepare(case.batch)
        q, k = rope_store(attn, case.qk, case.v, 0, case.cos, case.sin, case.norm_weight, 1e-6)
        outs.append(attn.forward(q, k, case.v, 0, 0.25, stored=True))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_forward_after_rope_store_does_not_store_again():
    shape = cases.SHAPES[0]
    case = cases.make_case(shape, torch.float32, True, 1)
    attn = _backend(shape, torch.float32, 1)
    attn.prepare(case.batch)
    q, _ = attn.rope_store(case.qk, case.v, 0, case.cos, case.sin, case.norm_weight, 1e-6)
    stored = attn.k_cache[0].clone(), attn.v_cache[0].clone()
    zeros = torch.zeros(case.v.shape), torch.zeros(case.v.shape)
    attn.forward(q, *zeros, 0, 0.25, stored=True)
    assert torch.equal(attn.k_cache[0], stored[0]) and torch.equal(attn.v_cache[0], stored[1])
    attn.forward(q, *zeros, 0, 0.25)  # without `stored`, forward stores
    assert not torch.equal(attn.k_cache[0], stored[0])
