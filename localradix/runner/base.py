"""The ModelRunner interface: the single seam between the scheduler and hardware.

Everything crossing it is numpy, so the scheduler never imports an array framework and any
backend (torch on CPU/CUDA/ROCm/NPU, MLX) plugs in behind it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from localradix.step import ForwardBatch, SampleOutput, SamplingBatch

if TYPE_CHECKING:
    from localradix.mem.kv_pool import KVPool
    from localradix.mem.kv_tiers import KVTransfer
    from localradix.runner.kv_budget import KVBudget


class LaunchedStep(Protocol):
    """A step handed to the device: its sampled tokens, now or once the device is done."""

    @property
    def placeholders(self) -> np.ndarray | None:
        """Negative stand-ins for this step's tokens, one per request, that the next step may
        pass as input ids before the host has seen the tokens; None if the step is done."""
        ...

    def result(self) -> SampleOutput:
        """The sampled tokens (waits for this step, not for later ones)."""
        ...


class StateSnapshots(Protocol):
    """A runner's saved model states, for models whose state at a position is more than the KV
    of the tokens before it (recurrent layers). The radix cache holds the handles (opaque to
    it: `SnapshotStore`); the runner holds what they name."""

    budget: int  # bytes of snapshots worth keeping

    def save(self, row: int) -> tuple[Any, int]:
        """(handle, bytes) of the state of request row `row` after every launched step."""
        ...

    def restore(self, row: int, handle: Any | None) -> None:
        """Row `row`'s next step starts from `handle`'s state (None: from no tokens at all)."""
        ...

    def release(self, handle: Any) -> None:
        """Forget a handle `save` gave out."""
        ...

    @property
    def live(self) -> int:
        """Handles given out and not released (the idle check compares it with the tree's)."""
        ...


@dataclass(frozen=True)
class FinishedStep:
    """A step that ran to completion inside `launch` (runners without overlap)."""

    output: SampleOutput
    placeholders: None = None

    def result(self) -> SampleOutput:
        return self.output


class ModelRunner(ABC):
    """Runs one model on one device. Owns the KV tensors, indexed by the pool's slots."""

    kv_capacity: int  # usable KV slots (tokens); slot 0 is an extra dummy
    # True when `launch` returns before the device is done, so the scheduler prepares step
    # N+1 while step N runs (see `localradix.runner.overlap`).
    overlaps: bool = False
    # True when adding the running requests' decode tokens to a prefill step costs little
    # (`--mixed-prefill auto` then mixes them in rather than pausing decode for the prefill).
    mixes_decode_into_prefill: bool = False
    # The most cached tokens worth keeping while no running request uses them (the default of
    # --max-cached-tokens); None = keep all that fit. Bounded where idle cached KV slows every
    # step (llama.cpp's unified cache: each step's attention scans every live cell).
    idle_cache_budget: int | None = None
    # True when the runner samples every row of `ForwardBatch.logit_index` (several positions
    # of a request: speculative verification); else the scheduler decodes plainly.
    verifies: bool = False
    # True when the runner returns `SampleOutput.pooled` for `ForwardBatch.pooling` (embedding
    # requests); else the scheduler refuses them.
    embeds: bool = False
    # Resident bytes of the weights as loaded (quantized ones at their packed size); None when
    # the runner cannot tell. Shown apart from the KV pool's bytes (ModelInfo, TUI, doctor).
    weight_bytes: int | None = None
    kv_budget: KVBudget | None = None  # how the KV pool was sized (None: not by plan_kv_budget)
    # Set for models with recurrent layers: a request resumes only where a snapshot of the
    # state was taken, so the scheduler takes them at branch points and when requests leave.
    snapshots: StateSnapshots | None = None
    # Copies KV slots to host memory and back, for the cache tiers below the radix tree (host
    # memory, disk); None where the runner cannot (the tiers are then off).
    kv_transfer: KVTransfer | None = None
    # The most requests it can run at once, where it holds fewer request rows than asked for
    # (`build_runner` lowers --max-running-requests to it); None: as many as asked.
    max_running_requests: int | None = None

    @property
    def kv_bytes(self) -> int | None:
        """Bytes the KV pool reserves (K and V, every layer), when the budget is known."""
        return self.kv_budget.bytes if self.kv_budget is not None else None

    @abstractmethod
    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        """Compute the new tokens' KV and sample one token per row of `batch.logit_index`
        (each request's last token unless it verifies drafts), with row r of `sampling`."""

    def launch(self, batch: ForwardBatch, sampling: SamplingBatch) -> LaunchedStep:
        """Start a step; `forward` to completion unless the runner overlaps."""
        return FinishedStep(self.forward(batch, sampling))

    def bind_kv(self, pool: KVPool, evict: Callable[[int], int]) -> None:
        """Called once by the scheduler with its slot pool and the radix cache's `evict`.

        A no-op for runners whose KV tensors are indexed by slot. A runner whose KV lives
        elsewhere (llama.cpp's cells, shared between sequences by tagging) listens to the
        pool's frees to release the same KV at the same moment, and evicts cached prefixes
        when it runs short of something the pool does not count (llama.cpp's sequence ids).
        """
        return None

    def check_kv(self, pool: KVPool) -> None:
        """Assert that the runner's own KV accounting agrees with `pool` (when idle)."""
        return None

    def close(self) -> None:
        """Release what outlives the runner object (tensor-parallel worker processes)."""
        return None
