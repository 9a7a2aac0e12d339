"""The worker ranks' processes, seen from rank 0: start, feed, watch, stop.

Each worker is a `python -m localradix.runner.tp.worker` subprocess (a subprocess, not a
multiprocessing child: the server's engine process is a daemon, which may not have those). Its
stdin is its control pipe: first its `WorkerSpec`, then the KV capacity, then one `Step` per
forward or one `KVRead`/`KVWrite` per copy for the cache tiers. Closing the pipe stops it
cleanly, and a worker whose rank 0 died reads end-of-file and exits, so no rank outlives the
engine. A worker that dies is reported by rank and exit code.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from localradix.runner.runner_config import RunnerConfig
    from localradix.step import ForwardBatch
    from localradix.store.source import ModelSource

STOP_TIMEOUT_S = 10.0  # a stopped worker exits within this, or is killed
POLL_S = 0.05


class RankDied(RuntimeError):
    """A tensor-parallel worker process is gone; the engine cannot step without it."""


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    size: int
    port: int  # rank 0's TCP store on the loopback interface
    device: str  # this rank's device, e.g. "cpu" or "cuda:1"
    args: RunnerConfig
    source: ModelSource
    dtype: str  # the model's, resolved
    kv_dtype: str  # the KV cache's, resolved
    attention: str  # attention backend, by registry name


@dataclass(frozen=True)
class Step:
    """One forward: the scheduler's plan; with `has_ids`, the input ids follow by broadcast
    (overlap scheduling resolves them on rank 0's device)."""

    batch: ForwardBatch
    has_ids: bool


@dataclass(frozen=True)
class KVRead:
    """Send rank 0 this rank's KV rows of `slots` by gather (for the cache tiers)."""

    slots: np.ndarray  # int64


@dataclass(frozen=True)
class KVWrite:
    """Take this rank's KV rows of `slots` from rank 0 by scatter and write them there."""

    slots: np.ndarray  # int64


class WorkerRanks:
    def __init__(self, specs: list[WorkerSpec]) -> None:
        root = str(Path(__file__).resolve().parents[3])  # the tree this localradix came from
        path = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        command = [sys.executable, "-m", "localradix.runner.tp.worker"]
        self.procs = [subprocess.Popen(command, stdin=subprocess.PIPE, env=env) for _ in specs]
        self._stop = weakref.finalize(self, _stop_all, list(self.procs))  # also at exit
        for spec in specs:
            self._send(spec.rank, spec)

    def send(self, message: Any) -> None:
        """`message` to every worker (raises RankDied if one is gone)."""
        self.check()
        for rank in range(1, len(self.procs) + 1):
            self._send(rank, message)

    def check(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            if proc.poll() is not None:
                raise RankDied(
                    f"tensor-parallel rank {rank} exited with code {proc.returncode} "
                    "(its error, if any, is in the log above); the engine stops"
                )

    def wait_for(self, ready: Callable[[int], bool], what: str) -> None:
        """Until `ready(rank)` holds for every worker, or one of them dies."""
        waiting = set(range(1, len(self.procs) + 1))
        while waiting:
            try:
                self.check()
            except RankDied as exc:
                raise RankDied(f"{exc} while {what}") from None
            waiting = {rank for rank in waiting if not ready(rank)}
            if waiting:
                time.sleep(POLL_S)

    def close(self) -> None:
        self._stop()

    def _send(self, rank: int, message: Any) -> None:
        pipe = self.procs[rank - 1].stdin
        assert pipe is not None
        try:
            pickle.dump(message, pipe, protocol=pickle.HIGHEST_PROTOCOL)
            pipe.flush()
        except (BrokenPipeError, ValueError):  # ValueError: the pipe was closed
            self.check()
            raise


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    pipes: list[IO[bytes] | None] = [p.stdin for p in procs]
    for pipe in pipes:
        try:
            if pipe is not None:
                pipe.close()  # end of file: the worker leaves its loop and the group
        except OSError:
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
