"""Fused decoder-layer ops in Triton (`LayerOps` with one kernel per call).

- add + RMSNorm: one program per row adds the residual, stores the new residual (rounded to
  the activations' dtype, as the unfused add leaves it) and its normalised form, computing the
  mean square in float32 over the rounded values.
- SiLU · mul: the gated MLP's activation over the fused gate/up output, in column tiles.

On a CPU, Triton's interpreter runs them (`TRITON_INTERPRET=1` before triton is imported); the
tests compare them with the torch reference there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from localradix.model_api.layer_ops import LayerOps

SILU_BLOCK = 1024  # columns of one SiLU · mul program


@triton.jit
def _add_rms_norm(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, n_cols, eps,
    stride_x, stride_res, stride_out, stride_new,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = x + tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        tl.store(new_res_ptr + row * stride_new + cols, x, mask=mask)
    h = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = h * inv_rms * w
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul(
    gate_up_ptr, out_ptr, n_cols, stride_in, stride_out, BLOCK: tl.constexpr
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + n_cols + cols, mask=mask, other=0.0)
    act = (gate * tl.sigmoid(gate)).to(up.dtype)  # SiLU in float32, rounded as F.silu rounds
    tl.store(out_ptr + row * stride_out + cols, act * up, mask=mask)


class TritonLayerOps(LayerOps):
    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x2 = x.reshape(-1, x.shape[-1])
        rows, cols = x2.shape
        out = torch.empty_like(x2)
        if residual is None:
            new_residual, res2 = x, x2  # (not read: HAS_RESIDUAL is off)
        else:
            res2 = residual.reshape(-1, cols)
            new_residual = torch.empty_like(x)
        new2 = new_residual.view(-1, cols)
        _add_rms_norm[(rows,)](
            x2, res2, weight, out, new2, cols, eps,
            x2.stride(0), res2.stride(0), out.stride(0), new2.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(cols),
        )  # fmt: skip
        return out.view(x.shape), new_residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        rows, cols = gate_up.shape[0], gate_up.shape[-1] // 2
        out = torch.empty((rows, cols), dtype=gate_up.dtype, device=gate_up.device)
        grid = (rows, triton.cdiv(cols, SILU_BLOCK))
        _silu_mul[grid](gate_up, out, cols, gate_up.stride(0), out.stride(0), BLOCK=SILU_BLOCK)
        return out
