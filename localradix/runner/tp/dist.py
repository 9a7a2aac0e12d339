"""`TPComm` over torch.distributed: gloo on CPUs, NCCL on CUDA (the CUDA path is untested here).

The ranks meet through a TCP store that rank 0 hosts on the loopback interface (one machine);
each worker marks its key there before joining, so rank 0 can tell a worker that died while
starting from one that is slow (see `runner.py`).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

HOST = "127.0.0.1"
# A collective waits this long for the other ranks (a step never takes so long; idle workers
# wait on their pipe, not in a collective).
TIMEOUT = timedelta(minutes=10)


def backend_for(device: torch.device | str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def connect_store(port: int, size: int) -> dist.TCPStore:
    """A worker's connection to rank 0's store."""
    return dist.TCPStore(HOST, port, size, False, timeout=TIMEOUT)


def joined_key(rank: int) -> str:
    return f"localradix/joined/{rank}"


def host_store(size: int) -> dist.TCPStore:
    """Rank 0's store, on a free port (`store.port`)."""
    return dist.TCPStore(HOST, 0, size, True, timeout=TIMEOUT, wait_for_workers=False)


def join(store: dist.Store, rank: int, size: int, device: torch.device | str) -> DistComm:
    """Join the process group (blocks until every rank has)."""
    if dist.is_initialized():
        raise RuntimeError("one tensor-parallel engine per process: a group already exists")
    if rank:
        store.set(joined_key(rank), "1")
    dist.init_process_group(
        backend_for(device), store=store, rank=rank, world_size=size, timeout=TIMEOUT
    )
    return DistComm(rank, size)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class DistComm:
    """The default process group's collectives."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x)
        return torch.cat(parts, dim=-1)

    def gather(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's `x` (same shape and dtype), rank order, at rank 0; None elsewhere."""
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(x.contiguous(), parts, dst=0)
        return parts

    def scatter(self, out: torch.Tensor, parts: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Rank 0's `parts[r]` into rank r's `out` (same shapes; `parts` only on rank 0)."""
        if self.rank != 0:
            dist.scatter(out, None, src=0)
            return out
        assert parts is not None
        dist.scatter(out, [p.contiguous() for p in parts], src=0)
        return out

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` into every rank's `x` (same shape and dtype)."""
        dist.broadcast(x, src=0)
        return x
