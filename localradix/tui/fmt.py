"""Short, tolerant number formatting for the panels: anything unknown renders as a dash."""

from __future__ import annotations

import math
from typing import Any

DASH = "–"


def number(v: Any) -> float | None:
    """`v` as a finite number, or None (bools, strings, NaN and missing values are not numbers)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def count(v: Any) -> str:
    """Token and request counts: 987, 4096, 12.3k, 4.56M."""
    n = number(v)
    if n is None:
        return DASH
    for limit, div, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(n) >= limit:
            return f"{n / div:.3g}{suffix}"
    return f"{n:.0f}" if n == int(n) else f"{n:.1f}"


def rate(v: Any) -> str:
    """Tokens per second."""
    n = number(v)
    return DASH if n is None else f"{count(n)}/s"


def pct(v: Any) -> str:
    """A ratio in [0, 1] as a whole percentage."""
    n = number(v)
    return DASH if n is None else f"{100 * n:.0f}%"


def seconds(v: Any) -> str:
    """Latencies: 85ms, 1.24s, 2m03s."""
    n = number(v)
    if n is None or n < 0:
        return DASH
    if n < 1:
        return f"{n * 1000:.0f}ms"
    if n < 60:
        return f"{n:.2f}s"
    return f"{int(n // 60)}m{int(n % 60):02d}s"


def uptime(v: Any) -> str:
    """Uptime: 0:04:12, 3:10:00, 2d 4h."""
    n = number(v)
    if n is None or n < 0:
        return DASH
    n = int(n)
    days, rest = divmod(n, 86400)
    if days:
        return f"{days}d {rest // 3600}h"
    return f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def gib(v: Any) -> str:
    """Bytes as GiB (or MiB below one GiB)."""
    n = number(v)
    if n is None:
        return DASH
    if n < 2**30:
        return f"{n / 2**20:.0f}M"
    return f"{n / 2**30:.1f}G"


def text(v: Any, width: int | None = None) -> str:
    """A value as one line of text, cut to `width` with an ellipsis."""
    if v is None or v == "":
        return DASH
    s = " ".join(str(v).split()) if isinstance(v, str) else str(v)
    if width is not None and len(s) > width:
        return s[: max(width - 1, 0)] + "…"
    return s
