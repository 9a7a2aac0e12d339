"""How much memory a model will take before it is loaded (weights + KV pool), and the budget
the loaded models share.

The weights come from the files (`loader/weight_memory.py`, as `doctor` computes them); the KV
pool is planned here (`runner/kv_budget.py`) from what the budget leaves, and the engine is
started with that many tokens (`--max-total-tokens`), so the estimate is also the reservation.
Nothing here imports torch: the API process calls it before spawning an engine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from localradix.config import ServerArgs
from localradix.messages import ModelInfo
from localradix.store.source import ModelSource

BUDGET_SHARE = 0.75  # default --memory-budget: this share of the device's (or host's) memory
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


class BudgetError(ValueError):
    """--memory-budget is not a size."""


@dataclass(frozen=True)
class MemoryPlan:
    weights: int  # bytes the weights take resident
    kv_tokens: int  # the KV pool the engine will reserve
    kv_bytes: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_bytes


def parse_size(text: str) -> int:
    """ "12GiB" / "800MB" / "2g" / "1073741824" -> bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise BudgetError(f"--memory-budget {text!r} is not a size; try 12GiB, 800MB or 8G")
    number, unit, binary = match.groups()
    scale = 1024 ** "bkmgt".index(unit.lower() or "b") if binary else _UNITS[unit.lower()]
    return int(float(number) * scale)


def default_budget(device: str) -> int:
    """A share of the GPU's memory (CUDA, read with nvidia-smi) or else of the host's RAM."""
    if device.startswith("cuda"):
        total = _cuda_total(device)
        if total:
            return int(total * BUDGET_SHARE)
    return int(_host_ram() * BUDGET_SHARE)


def resident_memory(info: ModelInfo, fallback: int) -> int:
    """What a loaded model really takes (its engine reports it), else the estimate."""
    if info.weight_bytes is None and info.kv_bytes is None:
        return fallback
    return (info.weight_bytes or 0) + (info.kv_bytes or 0)


def plan_memory(source: ModelSource, args: ServerArgs, like: ModelInfo, room: int) -> MemoryPlan:
    """Weights + KV of `source` loaded with `args` on the backend `like` (the default model)
    runs, the KV pool sized within `room` bytes (after the weights) as the engine sizes it."""
    from localradix.loader import load_model_config
    from localradix.loader.weight_memory import resident_bytes
    from localradix.model_api.kv_layout import KVLayout
    from localradix.runner.kv_budget import default_kv_dtype, plan_kv_budget
    from localradix.runner.runner_config import RunnerConfig

    backend, dtype = _backend_for(source.kind, like)
    try:
        weights = resident_bytes(source.path, source.kind, backend, dtype, args.quantize)
    except (OSError, ValueError, KeyError):
        weights = _size_on_disk(source)
    config = load_model_config(source)
    shape = KVLayout.for_model(config, default_kv_dtype(args.dtype, dtype))
    context = args.context_length or config.max_position_embeddings
    free = max(room - weights, 0)
    settings = RunnerConfig.from_args(args).replace(mem_fraction=1.0)
    budget = plan_kv_budget(settings, shape, context, free)
    return MemoryPlan(weights, budget.tokens, budget.bytes)


def _backend_for(kind: str, like: ModelInfo) -> tuple[str, str]:
    """The backend and dtype a model of `kind` gets: the default model's, unless that one
    cannot load it (llama.cpp loads only GGUF: torch then, in its float dtype)."""
    if like.backend != "llamacpp" or kind == "gguf":
        return like.backend, like.dtype
    return "torch", "float32" if like.device == "cpu" else "bfloat16"


def _size_on_disk(source: ModelSource) -> int:
    path = source.path
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.glob("*") if p.is_file())


def _host_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 1024**3  # a platform without sysconf: assume a small machine


def _cuda_total(device: str) -> int | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    index = device.partition(":")[2] or "0"
    query = [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", index]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=5, check=True)
        return int(float(out.stdout.strip().splitlines()[0])) * 1024**2  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 // 10 else f"{n / 1024**2:.0f} MiB"
