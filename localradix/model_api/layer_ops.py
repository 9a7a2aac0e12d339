"""The elementwise work of a decoder layer between its matmuls, as calls a backend may fuse.

A decoder block adds its residual and normalises twice, and gates its MLP once: unfused, each
is several kernels (add, square, mean, rsqrt, two multiplies; split, SiLU, multiply), and a
GPU decoding a small batch is bound by launching them, not by the arithmetic. The model calls
one method per fused operation on its attention backend's `ops`; this reference runs torch's
ops (every device), a GPU backend may bring one kernel each (`backends/cuda/triton_ops.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class LayerOps:
    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm of the new residual, the new residual = x + residual, or x when None)."""
        residual = x if residual is None else x + residual
        return F.rms_norm(residual, (residual.shape[-1],), weight, eps), residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] (gate rows, then up rows) -> SiLU(gate) * up [T, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


TORCH_LAYER_OPS = LayerOps()
