"""What the panels plot: the cache hit rate "now" and per-second histories.

Hit rates come from deltas of the engine's cumulative `cache_hit_tokens` / `cache_miss_tokens`
between snapshots, so "now" means the prompts admitted in the last few seconds. Counters that go
backwards mean the server restarted: the history starts over.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from localradix.tui.stats import Stats


@dataclass
class Second:
    """One second of history; None = nothing reported (idle or disconnected)."""

    t: int
    hit: float = 0.0
    miss: float = 0.0
    prefill: float | None = None
    decode: float | None = None

    @property
    def hit_rate(self) -> float | None:
        total = self.hit + self.miss
        return self.hit / total if total > 0 else None


@dataclass(frozen=True)
class Sample:
    t: float
    hit: float
    miss: float


class Trends:
    """Feed it every snapshot (`add`); read `hit_rate_now` and the `*_series` histories."""

    def __init__(self, window_s: float = 5.0, keep_s: int = 600) -> None:
        self.window_s = window_s
        self.seconds: deque[Second] = deque(maxlen=keep_s)
        self.samples: deque[Sample] = deque()
        self.restarts = 0

    def add(self, stats: Stats, now: float) -> None:
        t = stats.time if stats.time is not None else now
        sec = self._second(int(t))
        sec.prefill = stats.get("prefill_tokens_per_s")
        sec.decode = stats.get("decode_tokens_per_s")
        hit, miss = stats.get("cache_hit_tokens"), stats.get("cache_miss_tokens")
        if hit is None or miss is None:
            return
        prev = self.samples[-1] if self.samples else None
        if prev is not None and (hit < prev.hit or miss < prev.miss or t < prev.t):
            self.reset()
            self.restarts += 1
            prev, sec = None, self._second(int(t))
        if prev is not None:
            sec.hit += hit - prev.hit
            sec.miss += miss - prev.miss
        self.samples.append(Sample(t, hit, miss))
        while len(self.samples) > 2 and self.samples[1].t <= t - self.window_s:
            self.samples.popleft()

    def reset(self) -> None:
        self.seconds.clear()
        self.samples.clear()

    def _second(self, t: int) -> Second:
        """The bucket for second `t`, filling any gap since the last one with empty seconds."""
        last = self.seconds[-1] if self.seconds else None
        if last is not None and t <= last.t:
            return last
        if last is not None:
            for gap in range(max(last.t + 1, t - self.seconds.maxlen), t):  # type: ignore[operator]
                self.seconds.append(Second(gap))
        self.seconds.append(Second(t))
        return self.seconds[-1]

    @property
    def hit_rate_now(self) -> float | None:
        """Hit share of the prompt tokens admitted over the last `window_s` seconds."""
        if len(self.samples) < 2:
            return None
        a, b = self.samples[0], self.samples[-1]
        total = (b.hit - a.hit) + (b.miss - a.miss)
        return (b.hit - a.hit) / total if total > 0 else None

    def hit_series(self) -> list[float | None]:
        return [s.hit_rate for s in self.seconds]

    def prefill_series(self) -> list[float | None]:
        return [s.prefill for s in self.seconds]

    def decode_series(self) -> list[float | None]:
        return [s.decode for s in self.seconds]
