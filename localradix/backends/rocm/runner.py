"""ROCm runner: the CUDA device runner on a HIP build of torch (devices are named "cuda").

FlashInfer on ROCm is the separate FlashInfer+ROCm port (AMD-Ecosystem/flashinfer, `pip install
amd-flashinfer --index-url https://pypi.amd.com/simple/`, imported as `flashinfer`). Per its
README it covers batch prefill (paged and ragged), batch decode (with CUDA-graph capture) and
append_paged_kv_cache, in fp16/bf16, on gfx942 (MI300X/MI325X) and gfx950 (MI350X/MI355X) only.
There the runner uses FlashInfer and decode graphs; on every other AMD GPU, or without the
package, it runs torch-native attention (torch SDPA) without graphs.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from localradix.backends.cuda.runner import (
    HALF_DTYPES,
    create_device_runner,
    triton_unless_flashinfer,
)

if TYPE_CHECKING:
    from localradix.platform import Target
    from localradix.runner.runner_config import RunnerConfig
    from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.runner")

FLASHINFER_ROCM_ARCHS = ("gfx942", "gfx950")


def rocm_attention(arch: str, dtype: str, flashinfer_ok: bool) -> tuple[str, str]:
    """(attention backend, why) for an AMD GPU of `arch` (e.g. "gfx942:sramecc+:xnack-")."""
    base = arch.split(":")[0]
    if not flashinfer_ok:
        return "torch_native", "FlashInfer+ROCm (amd-flashinfer) is not installed"
    if base not in FLASHINFER_ROCM_ARCHS:
        return "torch_native", f"FlashInfer+ROCm does not support {base or 'this GPU'}"
    if dtype not in HALF_DTYPES:
        return "torch_native", f"FlashInfer has no {dtype} kernels"
    return "flashinfer", f"FlashInfer+ROCm on {base}"


def create_rocm_runner(args: RunnerConfig, source: ModelSource, target: Target) -> tuple[Any, Any]:
    import torch

    arch = getattr(torch.cuda.get_device_properties(target.device), "gcnArchName", "")
    has_flashinfer = importlib.util.find_spec("flashinfer") is not None
    has_triton = importlib.util.find_spec("triton") is not None
    choice = rocm_attention(arch, target.dtype, has_flashinfer)
    attention, why = triton_unless_flashinfer(choice, has_triton)
    if target.attention_backend != "flashinfer":  # a plugin spec asking for other kernels
        attention, why = target.attention_backend, "requested by the backend spec"
    logger.info("ROCm attention: %s (%s)", attention, why)
    return create_device_runner(args, source, target, attention)
