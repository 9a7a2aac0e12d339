"""Overlap scheduling support: launch step N+1 before step N's tokens reach the host.

`OverlapRunner.launch(batch, sampling)` enqueues a step on the device and returns at once with a
`PendingStep`: the sampled tokens stay on the device, are copied to pinned host memory without
waiting, and an event marks when the copy is done. The host can therefore schedule the next
step while the device computes this one, and read this step's results (`PendingStep.result()`)
after launching the next.

A request whose last token is still on the device is scheduled with a *placeholder* id instead
(`PendingStep.placeholders[i]`, negative): the runner swaps placeholders for the sampled tokens
on the device (`resolve_placeholders`), from a ring of future tokens (`FutureTokens`), as
SGLang's overlap scheduler does. The ring holds `capacity` tokens; a placeholder stays valid
while fewer than `capacity` newer tokens have been launched after it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from localradix.runner.base import ModelRunner
from localradix.runner.sampler import DeviceSample, sample_on_device
from localradix.runner.torch_runner import device_event
from localradix.step import ForwardBatch, SampleOutput, SamplingBatch


class LogitsRunner(Protocol):
    """What the overlap runner drives (e.g. `DeviceRunner`)."""

    kv_capacity: int
    device: Any

    def logits(self, batch: ForwardBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [num_rows, vocab] on the device; `input_ids` already on the device."""
        ...

    def close(self) -> None: ...


class FutureTokens:
    """Host bookkeeping of the ring: which ring entries each step's tokens go to.

    Placeholder of ring entry k is -(k + 1), so it can never be mistaken for a token id.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._next = 0

    def reserve(self, n: int) -> np.ndarray:
        """Ring entries (int64 [n]) for the next n sampled tokens, wrapping around."""
        if n > self.capacity:
            raise ValueError(f"{n} tokens in one step exceed the ring of {self.capacity}")
        entries = (self._next + np.arange(n, dtype=np.int64)) % self.capacity
        self._next = (self._next + n) % self.capacity
        return entries

    @staticmethod
    def placeholders(entries: np.ndarray) -> np.ndarray:
        return -(entries + 1)


def resolve_placeholders(input_ids: torch.Tensor, ring: torch.Tensor) -> torch.Tensor:
    """Token ids with every placeholder -(k + 1) replaced by ring[k] (on the ids' device)."""
    entries = (-input_ids - 1).clamp_(min=0)
    return torch.where(input_ids < 0, ring[entries], input_ids)


class HostCopies:
    """Non-blocking device-to-host copies and an event to wait on; synchronous on the CPU."""

    def __init__(self, device: torch.device | str) -> None:
        self.type = torch.device(device).type
        self.api: Any = None if self.type == "cpu" else getattr(torch, self.type)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        if self.api is None:
            return t.clone()
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.type == "cuda")
        return out.copy_(t, non_blocking=True)

    def event(self) -> Any:
        return device_event(self.type) or _DoneEvent()


class _DoneEvent:
    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


@dataclass
class PendingStep:
    """A launched step: placeholders for its tokens now, its results once the device is done."""

    placeholders: np.ndarray  # int64 [B]: what the next step passes as these requests' ids
    host: DeviceSample  # host tensors being filled by non-blocking copies
    event: Any  # recorded after the copies
    pooled: torch.Tensor | None = None  # host copy of the embedding rows' pooled states

    def done(self) -> bool:
        return bool(self.event.query())

    def result(self) -> SampleOutput:
        """Waits for the copies (not for later steps) and returns the sampled tokens."""
        self.event.synchronize()
        out = self.host.numpy()
        if self.pooled is None:
            return out
        return dataclasses.replace(out, pooled=self.pooled.numpy())


class OverlapRunner(ModelRunner):
    """Wraps a `LogitsRunner` so steps can be launched ahead of reading their results."""

    overlaps = True

    def __init__(
        self, runner: LogitsRunner, capacity: int = 4096, copies: HostCopies | None = None
    ) -> None:
        self.runner = runner
        self.kv_capacity = runner.kv_capacity
        self.kv_transfer = getattr(runner, "kv_transfer", None)  # same device, same stream
        # A verify step takes a ring entry per row; engine/core.py sizes the ring for k + 1 rows
        # per request when speculating, so verifying is the inner runner's to say (one that
        # does not say gives a row per request).
        self.verifies = bool(getattr(runner, "verifies", False))
        self.embeds = bool(getattr(runner, "embeds", False))
        self.futures = FutureTokens(capacity)
        self.ring = torch.zeros(capacity, dtype=torch.long, device=runner.device)
        self.copies = copies if copies is not None else HostCopies(runner.device)

    def launch(self, batch: ForwardBatch, sampling: SamplingBatch) -> PendingStep:
        """Enqueue forward + sampling of `batch`; its ids may hold earlier steps' placeholders."""
        with torch.inference_mode():
            ids = torch.from_numpy(batch.input_ids).to(self.runner.device, non_blocking=True)
            if bool((batch.input_ids < 0).any()):
                ids = resolve_placeholders(ids, self.ring)
            out = self._sample_step(batch, sampling, ids)
            entries = self.futures.reserve(batch.num_rows)  # one per row; a verify has several
            index = torch.from_numpy(entries).to(self.runner.device, non_blocking=True)
            self.ring.index_copy_(0, index, out.token_ids)
            host = out.map(self.copies.to_host)
            pooled = getattr(self.runner, "pooled", None) if batch.pooling is not None else None
            pooled = None if pooled is None else self.copies.to_host(pooled)
            last = FutureTokens.placeholders(entries[batch.last_row])
            return PendingStep(last, host, self.copies.event(), pooled)

    def _sample_step(
        self, batch: ForwardBatch, sampling: SamplingBatch, ids: torch.Tensor
    ) -> DeviceSample:
        """The inner runner's own step (a graph may sample inside it), else logits + sampler."""
        step = getattr(self.runner, "sample_step", None)
        if step is not None:
            return step(batch, sampling, ids)
        return sample_on_device(self.runner.logits(batch, ids), sampling)

    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        """Synchronous use (no overlap): launch and wait."""
        return self.launch(batch, sampling).result()

    def close(self) -> None:
        self.runner.close()
