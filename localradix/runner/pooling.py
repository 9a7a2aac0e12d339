"""Pooling the final hidden states of embedding requests (`ForwardBatch.pooling`), on the device.

A chunk is pooled on its own: "last" keeps its last token's state, "mean" sums its tokens'
states; the scheduler keeps the final chunk's "last" or adds the "mean" sums and divides once
the whole prompt is in, so a chunked prefill embeds exactly as an unchunked one.
"""

from __future__ import annotations

import torch

from localradix.step import ForwardBatch


def pool_hidden(hidden: torch.Tensor, batch: ForwardBatch) -> torch.Tensor | None:
    """float32 [num_reqs, hidden] (zero rows for requests that do not pool), or None when the
    batch pools nothing. `hidden`: [num_tokens, hidden], every new token's final state."""
    if batch.pooling is None:
        return None
    out = torch.zeros(batch.num_reqs, hidden.shape[-1], dtype=torch.float32, device=hidden.device)
    bounds = batch.qo_indptr.tolist()
    for i, mode in enumerate(batch.pooling):
        start, end = bounds[i], bounds[i + 1]
        if mode == "last":
            out[i] = hidden[end - 1].float()
        elif mode == "mean":
            out[i] = hidden[start:end].float().sum(dim=0)
    return out
