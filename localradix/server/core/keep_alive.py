"""How long a model stays loaded after its last request: seconds or a Go duration ("5m",
"1h30m", "-1"), the form Ollama's `keep_alive` and `--keep-alive` share."""

from __future__ import annotations

import re

from localradix.server.errors import bad_request

_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: float | str | None) -> float | None:
    """Seconds (negative: forever, 0: unload now); None: the server's default. A bad value is
    a 400 naming the field."""
    if value is None or isinstance(value, (int, float)):
        return value
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise bad_request(f"keep_alive: invalid duration {value!r} (try 300, '5m' or -1)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)
