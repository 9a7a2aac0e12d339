"""SamplingBatch and SampleOutput: what a step samples and what comes back, as numpy arrays
(row i = request i), so the sampler of every backend reads the same plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localradix.sampling_params import SamplingParams


@dataclass(frozen=True)
class SamplingBatch:
    """Per-request sampling parameters of one step, as arrays (row i = request i)."""

    temperature: np.ndarray  # float32 [B]; 0 = greedy
    top_p: np.ndarray  # float32 [B]
    top_k: np.ndarray  # int64 [B]; -1 = off
    min_p: np.ndarray  # float32 [B]
    uniform: np.ndarray  # float64 [B]: the random draw in [0, 1) for inverse-CDF sampling
    repetition_penalty: np.ndarray  # float32 [B]
    presence_penalty: np.ndarray  # float32 [B]
    frequency_penalty: np.ndarray  # float32 [B]
    # Per request, for penalties only: (all token ids so far, number of prompt tokens), else None.
    history: tuple[tuple[np.ndarray, int] | None, ...]
    logprobs: np.ndarray  # int64 [B]: top-k logprobs wanted (-1 = none)
    # int32 [B, ceil(V / 32)] grammar bitmask (bit set = token allowed), or None if unconstrained
    vocab_mask: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.temperature)

    @property
    def all_greedy(self) -> bool:
        return bool(np.all(self.temperature == 0.0))

    @property
    def any_penalty(self) -> bool:
        return any(h is not None for h in self.history)

    @property
    def max_logprobs(self) -> int:
        return int(self.logprobs.max()) if len(self.logprobs) else -1

    @staticmethod
    def build(
        params: Sequence[SamplingParams],
        uniform: np.ndarray,
        histories: Sequence[tuple[np.ndarray, int] | None],
        vocab_mask: np.ndarray | None = None,
    ) -> SamplingBatch:
        def col(name: str, dtype: type) -> np.ndarray:
            return np.array([getattr(p, name) for p in params], dtype=dtype)

        greedy = np.array([p.greedy for p in params], dtype=bool)
        temperature = np.where(greedy, 0.0, col("temperature", np.float32)).astype(np.float32)
        return SamplingBatch(
            temperature=temperature,
            top_p=col("top_p", np.float32),
            top_k=col("top_k", np.int64),
            min_p=col("min_p", np.float32),
            uniform=np.asarray(uniform, dtype=np.float64),
            repetition_penalty=col("repetition_penalty", np.float32),
            presence_penalty=col("presence_penalty", np.float32),
            frequency_penalty=col("frequency_penalty", np.float32),
            history=tuple(histories),
            logprobs=np.array(
                [-1 if p.logprobs is None else p.logprobs for p in params], dtype=np.int64
            ),
            vocab_mask=vocab_mask,
        )


@dataclass(frozen=True)
class SampleOutput:
    """One row per sampled position (`ForwardBatch.logit_index`; one per request unless a
    speculative verify samples several)."""

    token_ids: np.ndarray  # int64 [B]
    logprobs: np.ndarray | None = None  # float32 [B]: logprob of each chosen token
    top_ids: np.ndarray | None = None  # int64 [B, k]
    top_logprobs: np.ndarray | None = None  # float32 [B, k]
    # float32 [num_reqs, hidden]: each request's pooled hidden state (`ForwardBatch.pooling`;
    # zero rows for the others), or None when the batch pools nothing
    pooled: np.ndarray | None = None
