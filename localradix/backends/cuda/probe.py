"""CUDA: a CUDA (not HIP) build of torch that sees at least one device."""

from __future__ import annotations

import sys

from localradix.platform import Availability


def probe(explicit: bool) -> Availability:
    if sys.platform == "darwin":
        return Availability(False, "CUDA does not run on macOS")
    import torch

    from localradix.backends.torch_device import gpu_description

    if getattr(torch.version, "hip", None):
        return Availability(False, f"torch {torch.__version__} is a ROCm build (see rocm)")
    if not torch.version.cuda:
        return Availability(False, f"torch {torch.__version__} is built without CUDA")
    if not torch.cuda.is_available():
        return Availability(False, f"no CUDA device visible (torch {torch.__version__})")
    count = torch.cuda.device_count()
    dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    reason = f"{count} CUDA device(s), CUDA {torch.version.cuda}"
    return Availability(True, reason, "cuda", gpu_description(torch.cuda), dtype)
