"""Tokens-per-second over a sliding time window (for logs, /metrics and the TUI)."""

from __future__ import annotations

import time
from collections import deque


class ThroughputMeter:
    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int, float]] = deque()  # (end time, tokens, busy secs)

    def add(self, tokens: int, busy_s: float) -> None:
        self._events.append((time.monotonic(), tokens, busy_s))

    def rate(self, now: float) -> float:
        """Tokens per wall-clock second over the window (0 when nothing ran recently)."""
        while self._events and now - self._events[0][0] > self.window_s:
            self._events.popleft()
        if not self._events:
            return 0.0
        tokens = sum(e[1] for e in self._events)
        first_start = self._events[0][0] - self._events[0][2]
        return tokens / max(now - first_start, 1e-6)
