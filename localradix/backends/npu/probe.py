"""Ascend: torch_npu imports (it registers `torch.npu`) and sees at least one NPU."""

from __future__ import annotations

from typing import Any

from localradix.platform import Availability


def probe(explicit: bool) -> Availability:
    import torch
    import torch_npu  # noqa: F401  (registers the torch.npu device module)

    from localradix.backends.torch_device import gpu_description

    npu: Any = torch.npu  # type: ignore[attr-defined]
    if not npu.is_available():
        version = getattr(torch_npu, "__version__", "?")
        return Availability(False, f"torch_npu {version} sees no NPU")
    reason = f"{npu.device_count()} Ascend NPU(s)"
    return Availability(True, reason, "npu", gpu_description(npu), "bfloat16")
