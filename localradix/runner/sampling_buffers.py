"""Fixed per-row sampling parameters, so a captured decode step can end with the sampler.

A CUDA graph replays the kernels it recorded on the tensors it recorded, so the sampler inside
it reads its parameters from fixed device buffers that are refilled before each replay (one
host-to-device copy of every column) and writes the chosen ids into a fixed buffer. Rows past
the batch (graph padding) are filled as greedy rows and never read back.

What the graph expresses: temperature (0 = greedy), top-p, top-k, min-p and each row's random
draw (`SamplingBatch.uniform`, where a seeded request's determinism lives). What it does not:
logprobs, grammar masks and penalties (ragged per-request histories); a batch that asks for any
of them, or samples several rows per request, is sampled eagerly from the graph's logits.
"""

from __future__ import annotations

import numpy as np
import torch

from localradix.runner.sampler import sample_rows
from localradix.step import SamplingBatch

# Columns of the parameter buffer (float64 holds every float32 and int64 value used exactly).
TEMPERATURE, TOP_P, TOP_K, MIN_P, UNIFORM = range(5)
PADDING = (0.0, 1.0, 0.0, 0.0, 0.0)  # a greedy row with no filter


def samples_in_graph(sb: SamplingBatch | None, num_reqs: int) -> bool:
    """Whether the captured sampler can sample `sb` (one row per request, nothing eager-only)."""
    return (
        sb is not None
        and sb.size == num_reqs
        and sb.max_logprobs < 0
        and sb.vocab_mask is None
        and not sb.any_penalty
    )


class SamplingBuffers:
    """Parameter columns [5, rows] and chosen ids [rows] on the device, at fixed addresses."""

    def __init__(self, rows: int, device: torch.device | str) -> None:
        self.params = torch.zeros(len(PADDING), rows, dtype=torch.float64, device=device)
        self.params[TOP_P] = 1.0
        self.token_ids = torch.zeros(rows, dtype=torch.long, device=device)

    def fill(self, sb: SamplingBatch, size: int) -> None:
        """Rows [0, sb.size) from `sb`, rows [sb.size, size) as padding; one copy."""
        host = np.tile(np.asarray(PADDING, dtype=np.float64)[:, None], (1, size))
        n = sb.size
        host[TEMPERATURE, :n] = sb.temperature
        host[TOP_P, :n] = sb.top_p
        host[TOP_K, :n] = np.maximum(sb.top_k, 0)
        host[MIN_P, :n] = sb.min_p
        host[UNIFORM, :n] = sb.uniform
        self.params[:, :size].copy_(torch.from_numpy(host), non_blocking=True)

    def sample(self, logits: torch.Tensor) -> None:
        """Sample every row of `logits` [size, V] into `token_ids[:size]` (capturable)."""
        size = logits.shape[0]
        p = self.params[:, :size]
        f32 = torch.float32
        ids = sample_rows(
            logits,
            p[TEMPERATURE].to(f32),
            p[TOP_P].to(f32),
            p[TOP_K].to(torch.long),
            p[MIN_P].to(f32),
            p[UNIFORM],
        )
        self.token_ids[:size].copy_(ids)
