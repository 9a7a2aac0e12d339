"""ROCm: torch built with HIP (`torch.version.hip`) that sees at least one device."""

from __future__ import annotations

import sys

from localradix.platform import Availability


def probe(explicit: bool) -> Availability:
    if sys.platform == "darwin":
        return Availability(False, "ROCm does not run on macOS")
    import torch

    from localradix.backends.torch_device import gpu_description

    hip = getattr(torch.version, "hip", None)
    if not hip:
        return Availability(False, f"torch {torch.__version__} is not a ROCm (HIP) build")
    if not torch.cuda.is_available():
        return Availability(False, f"no ROCm device visible (HIP {hip})")
    reason = f"{torch.cuda.device_count()} ROCm device(s), HIP {hip}"
    return Availability(True, reason, "cuda", gpu_description(torch.cuda), "bfloat16")
