"""Resolve the `--dtype` setting to a torch dtype, in one place.

"auto" is bfloat16 on accelerators. On a CPU it is bfloat16 only where a quick measurement at
start-up finds bf16 matrix products clearly faster than fp32 for both decode-shaped (one row)
and prefill-shaped (many rows) inputs — true on CPUs with native bf16 (AVX512-BF16, AMX) — and
float32 everywhere else. Pass --dtype float32 for bit-for-bit comparisons with fp32 references.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

logger = logging.getLogger("localradix.loader")

_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# bf16 must beat fp32 by this factor on both shapes to be chosen on a CPU.
CPU_BF16_MIN_SPEEDUP = 1.2


def resolve_dtype(name: str | torch.dtype, device: torch.device | str = "cpu") -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        if torch.device(device).type != "cpu":
            return torch.bfloat16
        return torch.bfloat16 if cpu_bf16_is_faster() else torch.float32
    try:
        return _NAMES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose auto, {', '.join(_NAMES)}") from None


@functools.cache
def cpu_bf16_is_faster() -> bool:
    """Time fp32 vs bf16 matmuls of decode and prefill shapes (well under a second, once a process)."""
    weight = torch.randn(2048, 1024)  # [out, in], as nn.Linear stores it
    speedups = []
    for rows in (1, 128):
        x = torch.randn(rows, 1024)
        fp32 = _best_time(x, weight)
        bf16 = _best_time(x.bfloat16(), weight.bfloat16())
        speedups.append(fp32 / bf16)
    faster = min(speedups) >= CPU_BF16_MIN_SPEEDUP
    logger.info(
        "dtype auto on CPU: bf16 speed-up %s -> %s",
        ", ".join(f"{s:.2f}x" for s in speedups),
        "bfloat16" if faster else "float32",
    )
    return faster


def _best_time(x: torch.Tensor, w: torch.Tensor, repeats: int = 3) -> float:
    reps = 8 if x.shape[0] == 1 else 2
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(reps):
            torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return best
