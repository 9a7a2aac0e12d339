"""MLX: Apple silicon with Metal is auto-detected; any MLX build runs when asked for by name."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from localradix.platform import Availability


def is_apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def probe(explicit: bool) -> Availability:
    apple = is_apple_silicon()
    if not apple and not explicit:
        return Availability(
            False, f"not Apple silicon ({_installed()} runs here on the CPU with --backend mlx)"
        )
    import mlx.core as mx

    version = getattr(mx, "__version__", "?")
    if apple and mx.metal.is_available():
        info = _device_info(mx)
        memory = info.get("memory_size", 0) / 2**30
        detail = f"{info.get('architecture', 'Apple GPU')}, {memory:.1f} GiB unified memory"
        return Availability(
            True, f"Apple silicon, Metal (mlx {version})", "gpu", detail, "bfloat16"
        )
    why = "Metal unavailable" if apple else "requested with --backend mlx"
    return Availability(True, f"MLX on the CPU (mlx {version}; {why})", "cpu")


def _installed() -> str:
    try:
        return f"mlx {metadata.version('mlx')}"
    except metadata.PackageNotFoundError:
        return "mlx"


def _device_info(mx: object) -> dict:
    """Metal device facts; `mx.device_info` in newer MLX, `mx.metal.device_info` before."""
    getter = getattr(mx, "device_info", None) or mx.metal.device_info  # type: ignore[attr-defined]
    try:
        return dict(getter())
    except Exception:  # descriptive only
        return {}
