"""Resolve the `--dtype` setting to a torch dtype, in one place.

"auto" is float32 on CPU and bfloat16 on accelerators. On CPU float32 is the default because
small models there are bound by per-op overhead and fp32 GEMV kernels, where bf16 measured no
faster on the reference machine (see the loader's report); pass --dtype bfloat16 to override.
"""

from __future__ import annotations

import torch

_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str | torch.dtype, device: torch.device | str = "cpu") -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    try:
        return _NAMES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose auto, {', '.join(_NAMES)}") from None
