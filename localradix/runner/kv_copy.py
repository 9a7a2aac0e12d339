"""Copies of KV rows between a torch device and host memory, for the cache tiers.

`SyncCopies` (CPU, and any device without streams) finishes every copy before it returns.
`CudaCopies` lets the host and the compute stream go on while the bytes move:

- device to host (demotion): rows gathered on the compute stream go to a pinned buffer on a
  side stream that first waits for the compute stream; an event recorded after the copy is
  waited for before the host reads a byte (`HostRows.result`);
- host to device (promotion): host rows are staged in pinned memory and copied on the compute
  stream, so every later step on it, the one reading those slots included, runs after the copy.
  torch's pinned allocator keeps each staging buffer until its copy is done.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch


class HostRows(Protocol):
    """A device-to-host copy under way."""

    def done(self) -> bool:
        """Whether the bytes have landed (never waits)."""
        ...

    def result(self) -> np.ndarray:
        """The rows in host memory (pageable), waiting for the copy if it is still running."""
        ...


class HostCopies(Protocol):
    pinned: bool

    def to_host(self, rows: torch.Tensor) -> HostRows:
        """Start copying device `rows` to host memory; `rows` must not change afterwards."""
        ...

    def to_device(self, data: np.ndarray, device: torch.device) -> torch.Tensor:
        """`data` on `device`, ordered before any later work on the current stream."""
        ...


class Ready:
    """Rows already in host memory."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    def done(self) -> bool:
        return True

    def result(self) -> np.ndarray:
        return self.data


class SyncCopies:
    pinned = False

    def to_host(self, rows: torch.Tensor) -> HostRows:
        return Ready(rows.cpu().numpy())

    def to_device(self, data: np.ndarray, device: torch.device) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(data)).to(device)


class PinnedRows:
    """A side-stream copy into pinned memory; `source` stays referenced until it is done."""

    def __init__(self, host: torch.Tensor, event: torch.cuda.Event, source: torch.Tensor) -> None:
        self.host, self.event, self.source = host, event, source
        self.data: np.ndarray | None = None

    def done(self) -> bool:
        return self.data is not None or bool(self.event.query())

    def result(self) -> np.ndarray:
        if self.data is None:
            self.event.synchronize()
            # Pageable from here: pinned pages are scarce, and the tiers keep rows for long.
            self.data = self.host.numpy().copy()
            self.host = self.source = torch.empty(0)
        return self.data


class CudaCopies:
    pinned = True

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)

    def to_host(self, rows: torch.Tensor) -> HostRows:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # rows are gathered
        host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
        with torch.cuda.stream(self.stream):
            host.copy_(rows, non_blocking=True)
            rows.record_stream(self.stream)  # the allocator keeps rows' memory until then
            event = torch.cuda.Event()
            event.record(self.stream)
        return PinnedRows(host, event, rows)

    def to_device(self, data: np.ndarray, device: torch.device) -> torch.Tensor:
        staging = torch.empty(data.shape, dtype=torch.uint8, pin_memory=True)
        staging.numpy()[...] = data
        return staging.to(device, non_blocking=True)


def copies_for(device: torch.device | str) -> HostCopies:
    """Asynchronous pinned copies on a CUDA (or ROCm) device, synchronous ones elsewhere."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return CudaCopies(dev)
    return SyncCopies()
