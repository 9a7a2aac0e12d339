"""Rank 0 of a tensor-parallel model: the engine's runner.

It runs beside the scheduler like any `TorchRunner`, holding its own slice of the weights and
of the KV pool (the same slots on every rank, its share of the KV heads). Each forward first
sends the step's numpy plan to the worker ranks, which run the same forward on their slices;
the collectives inside the model line the ranks up, and rank 0 alone gathers the logits and
samples. Workers load in parallel with rank 0, each reading only its slice.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch

from localradix.model_api.shard import Shard
from localradix.runner.kv_transfer import TorchKVTransfer
from localradix.runner.torch_runner import TorchRunner
from localradix.runner.tp import dist as tpdist
from localradix.runner.tp.kv_transfer import tp_kv_transfer
from localradix.runner.tp.ranks import RankDied, Step, WorkerRanks, WorkerSpec
from localradix.step import ForwardBatch

if TYPE_CHECKING:
    from localradix.platform import Target
    from localradix.runner.runner_config import RunnerConfig
    from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.runner")


def ready_key(rank: int) -> str:
    return f"localradix/ready/{rank}"


def rank_device(device: str, rank: int) -> str:
    """Rank `rank`'s device: the same CPU, or the `rank`-th GPU after `device`'s."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return "cpu"
    return f"{dev.type}:{(dev.index or 0) + rank}"


def use_device(device: str, size: int) -> int:
    """Make `device` this process's own; on a CPU, where the ranks share the cores, take this
    rank's share of the threads. Returns the thread count before (to restore)."""
    threads = torch.get_num_threads()
    kind = torch.device(device).type
    if kind == "cpu":
        torch.set_num_threads(max((os.cpu_count() or 1) // size, 1))
    elif kind == "cuda":  # NCCL uses the current device for the group's own work
        torch.cuda.set_device(torch.device(device))
    return threads


class TensorParallelRunner(TorchRunner):
    def __init__(self, *args: Any, ranks: WorkerRanks, comm: tpdist.DistComm, **kw: Any) -> None:
        super().__init__(*args, **kw)
        # Rank 0 holds only its heads' KV: `create_tp_runner` sets a transfer over every rank's.
        local = self.kv_transfer
        self.local_kv = local if isinstance(local, TorchKVTransfer) else None
        self.kv_transfer = None
        self.ranks, self.comm = ranks, comm
        self.rank_weight_bytes: tuple[int, ...] = ()  # every rank's, rank 0 first
        self.store: Any = None  # rank 0 hosts the ranks' TCP store: kept while they run
        self.threads = torch.get_num_threads()  # the engine process's own, restored at close

    @torch.inference_mode()
    def logits(self, batch: ForwardBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        self.ranks.send(Step(batch, input_ids is not None))
        try:
            if input_ids is not None:
                self.comm.broadcast(input_ids.contiguous())
            return super().logits(batch, input_ids)
        except RankDied:
            raise
        except RuntimeError:  # a collective failed: say which rank died, if one did
            self.ranks.check()
            raise

    def close(self) -> None:
        self.ranks.close()
        tpdist.leave()
        torch.set_num_threads(self.threads)


def create_tp_runner(
    args: RunnerConfig,
    source: ModelSource,
    target: Target,
    attention: str,
    dtype: torch.dtype,
) -> tuple[TensorParallelRunner, Any]:
    """Start the workers, join them, load rank 0's slice and size the KV pool for every rank."""
    size = args.tp
    _refuse_unsupported(size, source, target.device)
    store = tpdist.host_store(size)
    specs = [
        WorkerSpec(
            rank, size, store.port, rank_device(target.device, rank), args, source,
            target.dtype, target.cache_dtype, attention,
        )
        for rank in range(1, size)
    ]  # fmt: skip
    ranks = WorkerRanks(specs)
    threads = use_device(target.device, size)
    try:
        ranks.wait_for(lambda r: store.check([tpdist.joined_key(r)]), "starting")
        comm = tpdist.join(store, 0, size, target.device)
        runner, config = _load_rank0(args, source, target, attention, dtype, ranks, comm)
        ranks.send(runner.kv_capacity)
        ranks.wait_for(lambda r: store.check([ready_key(r)]), "loading its slice")
    except BaseException:
        ranks.close()
        tpdist.leave()
        torch.set_num_threads(threads)
        raise
    workers = tuple(int(store.get(ready_key(r))) for r in range(1, size))
    runner.rank_weight_bytes = (runner.weight_bytes or 0, *workers)
    runner.store, runner.threads = store, threads
    runner.kv_transfer = tp_kv_transfer(runner.local_kv, config, comm, ranks)
    logger.info(
        "Tensor parallel over %d ranks (%s): weights per rank %s MiB",
        size,
        tpdist.backend_for(target.device),
        ", ".join(f"{b / 2**20:.1f}" for b in runner.rank_weight_bytes),
    )
    return runner, config


def _load_rank0(
    args: RunnerConfig,
    source: ModelSource,
    target: Target,
    attention: str,
    dtype: torch.dtype,
    ranks: WorkerRanks,
    comm: tpdist.DistComm,
) -> tuple[TensorParallelRunner, Any]:
    from localradix.loader import load_model, resolve_dtype

    device = target.device
    model, config = load_model(source, dtype, device, max_positions=args.context_length, tp=comm)
    kv_dtype = resolve_dtype(target.cache_dtype)
    runner = TensorParallelRunner(
        model, model.config, _per_rank(args, device, comm.size), device, dtype, attention,
        kv_dtype=kv_dtype, ranks=ranks, comm=comm,
    )  # fmt: skip
    return runner, config


def _refuse_unsupported(size: int, source: ModelSource, device: str) -> None:
    """Raise before any rank starts: GGUF files, splits that do not divide, too few GPUs."""
    from localradix.loader import load_model_config

    if source.kind != "hf":
        raise ValueError(
            f"--tp {size} loads Hugging Face safetensors folders, not GGUF files: give the "
            "model's folder (or serve the GGUF with --tp 1)"
        )
    Shard(0, size).check(load_model_config(source))
    kind = torch.device(device).type
    if kind == "cpu":
        return
    first = torch.device(device).index or 0
    count = int(getattr(torch, kind).device_count())
    if first + size > count:
        raise ValueError(f"--tp {size} needs {size} {kind} devices from {device}; {count} seen")


def _per_rank(args: RunnerConfig, device: str, size: int) -> RunnerConfig:
    """On a CPU the ranks share one memory: each sizes its KV pool from its share of it."""
    if torch.device(device).type != "cpu" or args.max_total_tokens:
        return args
    return args.replace(mem_fraction=args.mem_fraction / size)
