"""The fused decoder-layer ops in Triton (add + RMSNorm, SiLU · mul) under Triton's CPU
interpreter, against the torch reference the model runs everywhere else (`LayerOps`)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from localradix.backends.cuda import triton_attention  # noqa: E402
from localradix.backends.cuda.triton_ops import SILU_BLOCK, TritonLayerOps  # noqa: E402
from localradix.model_api.layer_ops import TORCH_LAYER_OPS  # noqa: E402

if not triton_attention.interpreter_active():  # tests/conftest.py turns it on without a GPU
    pytest.skip("triton runs compiled here (a GPU)", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")
TOL = {torch.float32: 2e-6, torch.float16: 2e-3}
FUSED = TritonLayerOps()


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(
        got.float(), want.float(), atol=TOL[want.dtype], rtol=TOL[want.dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows, cols", [(1, 64), (5, 100), (33, 24)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_the_reference(dtype, rows, cols, with_residual):
    gen = torch.Generator().manual_seed(rows * cols)
    x = (torch.randn(rows, cols, generator=gen) * 3).to(dtype)
    residual = torch.randn(rows, cols, generator=gen).to(dtype) if with_residual else None
    weight = (torch.rand(cols, generator=gen) + 0.5).to(dtype)
    normed, new_residual = FUSED.add_rms_norm(x, residual, weight, 1e-5)
    want_normed, want_residual = TORCH_LAYER_OPS.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(new_residual, want_residual)  # the same rounded sum the unfused add makes
    _close(normed, want_normed)
    if residual is not None:  # inputs are left as they were
        assert not torch.equal(new_residual, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows, cols", [(1, 16), (3, 100), (2, SILU_BLOCK + 37)])
def test_silu_mul_matches_the_reference(dtype, rows, cols):
    gen = torch.Generator().manual_seed(rows + cols)
    gate_up = (torch.randn(rows, 2 * cols, generator=gen) * 4).to(dtype)
    _close(FUSED.silu_mul(gate_up), TORCH_LAYER_OPS.silu_mul(gate_up))


def test_the_triton_backend_brings_the_fused_ops():
    from localradix.model_api.kv_layout import KVLayout

    attn = triton_attention.TritonAttention(KVLayout(1, 1, 16, "float32", 8), "cpu")
    assert isinstance(attn.ops, TritonLayerOps)
