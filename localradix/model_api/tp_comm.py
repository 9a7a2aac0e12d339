"""The collectives a tensor-parallel model calls, as an interface; `SINGLE` is tp=1.

Model code sees only this: one all-reduce after each row-parallel linear (attention's output
projection, the MLP's down projection) and after the vocab-parallel embedding, and a gather of
the vocab-parallel logits. At tp=1 every call returns its argument, so the single-device path
is unchanged. No torch.distributed here (see `dist.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class TPComm(Protocol):
    rank: int
    size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of `x` over the ranks (every rank gets it; may reuse `x`'s memory)."""
        ...

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` [N, C] side by side, rank order: [N, size * C]."""
        ...


class SingleRank:
    """tp=1: nothing to communicate."""

    rank = 0
    size = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        return x


SINGLE = SingleRank()
