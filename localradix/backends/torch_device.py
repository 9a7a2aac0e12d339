"""The torch reference runner on a torch device (the cpu backend), and device descriptions.

The CUDA, ROCm and NPU backends build `DeviceRunner` instead (`localradix.backends.cuda.runner`:
FlashInfer / vendor attention, decode graphs, KV sized from device memory). Torch is imported
only inside these functions.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from localradix.platform import Target
    from localradix.runner.runner_config import RunnerConfig
    from localradix.store.source import ModelSource


def load_torch_model(args: RunnerConfig, source: ModelSource, target: Target) -> tuple[Any, ...]:
    """(model, config, torch dtype): the model loaded on `target.device` in its dtype."""
    from localradix.loader import load_model, resolve_dtype

    dtype = resolve_dtype(target.dtype, target.device)
    model, config = load_model(
        source, dtype=dtype, device=target.device, max_positions=args.context_length
    )
    return model, config, dtype


def create_torch_runner(args: RunnerConfig, source: ModelSource, target: Target) -> tuple[Any, Any]:
    """Load the torch model on `target.device` and wrap it in the reference `TorchRunner`."""
    from localradix.loader import resolve_dtype
    from localradix.runner.torch_runner import TorchRunner

    if args.tp > 1:  # one slice per rank: rank 0 here, the others in worker processes
        from localradix.runner.tp.runner import create_tp_runner

        dtype = resolve_dtype(target.dtype, target.device)
        return create_tp_runner(args, source, target, target.attention_backend, dtype)
    model, config, dtype = load_torch_model(args, source, target)
    kv_dtype = resolve_dtype(target.cache_dtype)
    runner = TorchRunner(
        model, config, args, target.device, dtype, target.attention_backend, kv_dtype=kv_dtype
    )
    return runner, config


def cpu_description() -> str:
    """E.g. "x86_64, 16 cores, 62.7 GiB RAM (51.0 GiB available)"."""
    memory = psutil.virtual_memory()
    cores = psutil.cpu_count(logical=True) or 0
    name = platform.processor() or platform.machine()
    return (
        f"{name}, {cores} cores, {memory.total / 2**30:.1f} GiB RAM "
        f"({memory.available / 2**30:.1f} GiB available)"
    )


def gpu_description(api: Any) -> str:
    """Names and memory of the devices `api` (torch.cuda / torch.npu) sees."""
    parts = []
    for i in range(api.device_count()):
        try:
            props = api.get_device_properties(i)
            parts.append(f"{i}: {props.name} ({props.total_memory / 2**30:.1f} GiB)")
        except Exception as exc:  # descriptive only; never fail a probe over it
            parts.append(f"{i}: ({type(exc).__name__})")
    return "; ".join(parts)
