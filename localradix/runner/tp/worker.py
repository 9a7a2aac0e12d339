"""A worker rank of a tensor-parallel model (`python -m localradix.runner.tp.worker`).

Started by rank 0 (`ranks.py`), it reads everything from stdin: its `WorkerSpec`, then the KV
capacity rank 0 chose, then one `Step` per forward, which it runs on its slice (forward only:
rank 0 samples), or a KV copy for the cache tiers (`kv_transfer.py`). End of file on stdin
(rank 0 stopped, or died) ends it.
"""

from __future__ import annotations

import logging
import pickle
import sys
from typing import IO

import torch

from localradix.runner.kv_transfer import TorchKVTransfer
from localradix.runner.torch_runner import TorchRunner
from localradix.runner.tp import dist as tpdist
from localradix.runner.tp.kv_transfer import serve_kv
from localradix.runner.tp.ranks import KVRead, KVWrite, Step, WorkerSpec
from localradix.runner.tp.runner import ready_key, use_device

logger = logging.getLogger("localradix.runner")


def main() -> None:
    pipe = sys.stdin.buffer
    spec: WorkerSpec = pickle.load(pipe)
    logging.basicConfig(
        level=spec.args.log_level.upper(),
        format=f"%(asctime)s %(levelname)s [rank {spec.rank}] %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    use_device(spec.device, spec.size)
    store = tpdist.connect_store(spec.port, spec.size)
    comm = tpdist.join(store, spec.rank, spec.size, spec.device)
    try:
        runner = _load(spec, comm, pipe)
        store.set(ready_key(spec.rank), str(runner.weight_bytes or 0))
        serve(runner, comm, pipe)
    finally:
        tpdist.leave()


def _load(spec: WorkerSpec, comm: tpdist.DistComm, pipe: IO[bytes]) -> TorchRunner:
    from localradix.loader import load_model, resolve_dtype

    dtype = resolve_dtype(spec.dtype)
    model, _ = load_model(
        spec.source, dtype, spec.device, max_positions=spec.args.context_length, tp=comm
    )
    capacity: int = pickle.load(pipe)
    args = spec.args.replace(max_total_tokens=capacity)  # the same slots as rank 0
    kv_dtype = resolve_dtype(spec.kv_dtype)
    return TorchRunner(
        model, model.config, args, spec.device, dtype, spec.attention, kv_dtype=kv_dtype
    )


def serve(runner: TorchRunner, comm: tpdist.DistComm, pipe: IO[bytes]) -> None:
    """Run every step and KV copy rank 0 sends until the pipe ends."""
    while True:
        try:
            step: Step | KVRead | KVWrite = pickle.load(pipe)
        except EOFError:
            return
        if not isinstance(step, Step):
            local = runner.kv_transfer  # rank 0 copies only when every rank can
            assert isinstance(local, TorchKVTransfer)
            serve_kv(step, local, comm)
            continue
        ids = None
        if step.has_ids:
            empty = torch.empty(step.batch.num_tokens, dtype=torch.long, device=runner.device)
            ids = comm.broadcast(empty)
        runner.logits(step.batch, ids)


if __name__ == "__main__":
    main()
