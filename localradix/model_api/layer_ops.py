"""The elementwise work of a decoder layer between its matmuls, as calls a backend may fuse.

A decoder block adds its residual and normalises twice, and gates its MLP once: unfused, each
is several kernels (add, square, mean, rsqrt, two multiplies; split, SiLU, multiply), and a
GPU decoding a small batch is bound by launching them, not by the arithmetic. The model calls
one method per fused operation on its attention backend's `ops`; this reference runs torch's
ops (every device), a GPU backend may bring one kernel each (`backends/cuda/triton_ops.py`).
The per-head q/k norm and RoPE are here too; fused with the K/V store they are the attention
backend's `rope_store` (`model_api/attention.py`), which calls this reference by default.
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

    def qk_norm_rope(
        self,
        qk: torch.Tensor,
        norm_weight: torch.Tensor | None,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        eps: float,
    ) -> torch.Tensor:
        """qk [T, H, D] (q heads, then k heads) -> RMSNorm of each head times norm_weight
        [H, D] (None: no norm), then RoPE with cos / signed sin [T, 1, R] on each head's leading
        R dims (None: a layer without RoPE)."""
        if norm_weight is not None:
            qk = F.rms_norm(qk, (qk.shape[-1],), None, eps) * norm_weight
        if cos is None or sin is None:
            return qk
        if cos.shape[-1] == qk.shape[-1]:
            return apply_rotary(qk, cos, sin)
        return apply_partial_rotary(qk, cos, sin)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] -> x * cos + rotate_half(x) * sin (rotate_half's sign lives in `sin`)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)


def apply_partial_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the leading cos.shape[-1] dims of each head; the rest pass through."""
    rot = cos.shape[-1]
    return torch.cat([apply_rotary(x[..., :rot], cos, sin), x[..., rot:]], dim=-1)


TORCH_LAYER_OPS = LayerOps()
