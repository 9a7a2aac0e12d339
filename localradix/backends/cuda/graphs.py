"""CUDA-graph capture of decode steps: one graph per batch size, padded up to the next size.

A decode step at batch size B is hundreds of small kernels whose launch cost dominates at small
B; replaying a captured graph launches them at once. Graphs are captured for a fixed list of
sizes (`graph_batch_sizes`); a decode batch of n requests runs the smallest size >= n, padded
with dummy requests that read and write only the dummy slot 0 (`pad_decode_batch`). Batches with
an extend, or larger than the largest size, run eagerly.

Everything a graph reads lives in fixed buffers (token ids, positions, the attention backend's
per-size `DecodeGraphState`, the sampler's parameters); before each replay they are refilled
and the attention backend re-plans into them. The captured step ends with the sampler
(`SamplingBuffers`), so a decode step whose sampling it can express leaves the device with only
its chosen ids; other batches are sampled eagerly from the logits the graph also leaves. The
bucket choice and padding are pure functions, tested on the CPU; the capture itself goes
through `CudaGraphApi`, which tests replace with a fake.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from localradix.runner.sampling_buffers import SamplingBuffers, samples_in_graph
from localradix.step import ForwardBatch, SamplingBatch

logger = logging.getLogger("localradix.runner")

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)


def graph_batch_sizes(max_batch: int, largest: int = 256) -> tuple[int, ...]:
    """Sizes to capture for up to `max_batch` running requests (the cap itself included)."""
    limit = min(max_batch, largest)
    if limit < 1:
        return ()
    return tuple(b for b in GRAPH_BATCH_SIZES if b < limit) + (limit,)


def select_batch_size(num_reqs: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest captured size that holds `num_reqs`, or None if none does."""
    i = bisect.bisect_left(sizes, num_reqs)
    return sizes[i] if i < len(sizes) else None


def pad_decode_batch(batch: ForwardBatch, size: int) -> ForwardBatch:
    """`batch` plus dummy decode requests up to `size`: token 0 at position 0 in slot 0."""
    pad = size - batch.num_reqs
    if pad < 0 or not batch.is_decode_only:
        raise ValueError(f"cannot pad a batch of {batch.num_reqs} requests to {size} decodes")
    if pad == 0:
        return batch
    zeros, ones = np.zeros(pad, dtype=np.int64), np.ones(pad, dtype=np.int64)
    last_q, last_kv = batch.qo_indptr[-1], batch.kv_indptr[-1]
    return ForwardBatch(
        input_ids=np.concatenate([batch.input_ids, zeros]),
        positions=np.concatenate([batch.positions, zeros]),
        out_slots=np.concatenate([batch.out_slots, zeros]),
        qo_indptr=np.concatenate([batch.qo_indptr, last_q + np.arange(1, pad + 1)]),
        kv_indptr=np.concatenate([batch.kv_indptr, last_kv + np.arange(1, pad + 1)]),
        kv_indices=np.concatenate([batch.kv_indices, zeros]),
        seq_lens=np.concatenate([batch.seq_lens, ones]),
        extend_lens=np.concatenate([batch.extend_lens, ones]),
    )


def total_pages(batch: ForwardBatch, page_size: int) -> int:
    return int(((batch.seq_lens + page_size - 1) // page_size).sum())


class GraphApi(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """Record `fn` once; returns (replay, the output tensor every replay rewrites)."""
        ...


class CudaGraphApi:
    """torch.cuda graphs sharing one memory pool (capture the largest size first)."""

    def __init__(self) -> None:
        self.pool: Any = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up: lazy inits and autotuning stay out of the graph
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        self.pool = graph.pool()
        return graph.replay, out


class DecodeGraphs:
    """Captured decode steps of `model` over a graph-capable attention backend.

    The backend provides `graph_state(batch_size, max_pages)` and `prepare_graph(state, batch)`
    (see `FlashInferAttention`); `run` returns float32 logits [num_reqs, vocab], and
    `run_sampled` also the ids the captured sampler chose when it could sample the batch.
    """

    def __init__(
        self,
        model: Any,
        attn: Any,
        sizes: tuple[int, ...],
        max_pages_per_req: int,
        device: torch.device | str,
        api: GraphApi | None = None,
    ) -> None:
        self.model, self.attn, self.sizes = model, attn, tuple(sorted(sizes))
        self.api = api if api is not None else CudaGraphApi()
        largest = self.sizes[-1]
        # Requests sharing a cached prefix list its pages each, so bound per request.
        self.max_pages = largest * max_pages_per_req
        self.input_ids = torch.zeros(largest, dtype=torch.long, device=device)
        self.positions = torch.zeros(largest, dtype=torch.long, device=device)
        self.sampling = SamplingBuffers(largest, device)
        self.counts = {"replays": 0, "sampled_in_graph": 0, "sampled_eagerly": 0}
        self._states: dict[int, Any] = {}
        self._replays: dict[int, Callable[[], None]] = {}
        self._logits: dict[int, torch.Tensor] = {}

    @torch.inference_mode()
    def capture(self) -> None:
        for size in reversed(self.sizes):  # largest first: smaller graphs reuse its pool
            state = self.attn.graph_state(size, self.max_pages)
            self._states[size] = state
            self.attn.prepare_graph(state, _dummy_decode(size))
            self.input_ids[:size].zero_()
            self.positions[:size].zero_()
            self._replays[size], self._logits[size] = self.api.capture(self._step_fn(size))
        logger.info("Captured decode graphs for batch sizes %s", ", ".join(map(str, self.sizes)))

    def _step_fn(self, size: int) -> Callable[[], torch.Tensor]:
        ids, positions = self.input_ids[:size], self.positions[:size]

        def step() -> torch.Tensor:
            hidden = self.model.forward(ids, positions, self.attn)
            logits = self.model.compute_logits(hidden).float()
            self.sampling.sample(logits)  # into sampling.token_ids[:size]
            return logits

        return step

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            bool(self._replays)
            and batch.is_decode_only
            and batch.num_reqs <= self.sizes[-1]
            and total_pages(batch, self.attn.page_size) <= self.max_pages - self.sizes[-1]
        )

    def run(self, batch: ForwardBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Replay the graph for `batch` (decode only); `input_ids` may already be on device."""
        return self.run_sampled(batch, None, input_ids)[0]

    def run_sampled(
        self,
        batch: ForwardBatch,
        sampling: SamplingBatch | None,
        input_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [n, vocab], ids [n] the captured sampler chose, or None when it could not
        sample `sampling`: the caller samples the logits eagerly). Both are views of fixed
        buffers that the next replay overwrites; padding rows are never returned."""
        n = batch.num_reqs
        size = select_batch_size(n, self.sizes)
        assert size is not None, "check can_run first"
        padded = pad_decode_batch(batch, size)
        self.attn.prepare_graph(self._states[size], padded)
        if input_ids is None:
            self.input_ids[:size].copy_(torch.from_numpy(padded.input_ids), non_blocking=True)
        else:
            self.input_ids[:n].copy_(input_ids)
            self.input_ids[n:size].zero_()
        self.positions[:size].copy_(torch.from_numpy(padded.positions), non_blocking=True)
        in_graph = sampling is not None and samples_in_graph(sampling, n)
        if in_graph:
            assert sampling is not None
            self.sampling.fill(sampling, size)
        self._replays[size]()
        self.counts["replays"] += 1
        self.counts["sampled_in_graph" if in_graph else "sampled_eagerly"] += sampling is not None
        tokens = self.sampling.token_ids[:n] if in_graph else None
        return self._logits[size][:n], tokens


def _dummy_decode(size: int) -> ForwardBatch:
    empty = ForwardBatch(
        input_ids=np.zeros(0, dtype=np.int64),
        positions=np.zeros(0, dtype=np.int64),
        out_slots=np.zeros(0, dtype=np.int64),
        qo_indptr=np.zeros(1, dtype=np.int64),
        kv_indptr=np.zeros(1, dtype=np.int64),
        kv_indices=np.zeros(0, dtype=np.int64),
        seq_lens=np.zeros(0, dtype=np.int64),
        extend_lens=np.zeros(0, dtype=np.int64),
    )
    return pad_decode_batch(empty, size)
