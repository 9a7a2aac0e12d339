"""Ascend runner: the device runner on "npu" with torch_npu's fused attention for decode."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from localradix.backends.cuda.runner import HALF_DTYPES, create_device_runner

if TYPE_CHECKING:
    from localradix.platform import Target
    from localradix.runner.runner_config import RunnerConfig
    from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.runner")


def npu_attention(dtype: str) -> tuple[str, str]:
    if dtype in HALF_DTYPES:
        return "npu_fused", "torch_npu fused decode attention, torch-native prefill"
    return "torch_native", f"the fused NPU attention has no {dtype} kernels"


def create_npu_runner(args: RunnerConfig, source: ModelSource, target: Target) -> tuple[Any, Any]:
    import torch_npu  # noqa: F401  (registers the "npu" device before the model is built)

    attention, why = npu_attention(target.dtype)
    logger.info("NPU attention: %s (%s)", attention, why)
    return create_device_runner(args, source, target, attention)
