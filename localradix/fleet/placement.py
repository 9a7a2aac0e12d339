"""Where each replica runs: one GPU each on CUDA (CUDA_VISIBLE_DEVICES), else the CPU with its
cores split between the replicas (--threads for llama.cpp, OMP_NUM_THREADS for torch)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

from localradix.config import ServerArgs

CPU_BACKENDS = ("cpu", "llamacpp", "mlx")  # mlx: one unified memory, no per-device split


@dataclass(frozen=True)
class Placement:
    label: str  # for the log: "GPU 1", "CPU, 4 threads"
    env: Mapping[str, str] = field(default_factory=dict)  # added to the worker's environment
    flags: tuple[str, ...] = ()  # added to the worker's command line


def place_replicas(
    count: int, args: ServerArgs, gpus: list[str] | None = None, cores: int | None = None
) -> list[Placement]:
    gpus = visible_gpus() if gpus is None else gpus
    if gpus and args.backend not in CPU_BACKENDS:
        return [_on_gpu(gpus[i % len(gpus)]) for i in range(count)]
    threads = max(1, (cores or os.cpu_count() or 1) // count)
    return [_on_cpu(threads, args) for _ in range(count)]


def _on_gpu(gpu: str) -> Placement:
    return Placement(f"GPU {gpu}", {"CUDA_VISIBLE_DEVICES": gpu, "HIP_VISIBLE_DEVICES": gpu})


def _on_cpu(threads: int, args: ServerArgs) -> Placement:
    flags = () if args.threads is not None else ("--threads", str(threads))
    env = {"OMP_NUM_THREADS": str(args.threads or threads)}
    return Placement(f"CPU, {args.threads or threads} threads", env, flags)


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, without importing torch: CUDA_VISIBLE_DEVICES
    if set, else one entry per line of `nvidia-smi -L`."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
