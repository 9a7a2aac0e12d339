"""Prometheus metrics in the text exposition format (written by hand: no extra dependency).

Latencies and token counters are measured in the API process as outputs arrive; engine gauges
(KV, running, queued, cache hits) come from the latest EngineStats snapshot the engine pushed,
and so do the cache tiers below the radix tree (host memory, disk), when they are on.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from localradix.messages import EngineStats

PREFIX = "localradix"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)

# KVTiers.stats() keys -> the counters' help; each is localradix_kv_tier_<key>_total.
TIER_COUNTERS = (
    ("demoted_tokens", "KV tokens copied down a tier when the radix tree evicted them."),
    ("promoted_tokens", "KV tokens loaded back from a tier into the radix tree."),
    ("promotions", "Requests that loaded KV back from a tier."),
    ("skipped_tokens", "KV tokens found in a tier but prefilled instead (measured cheaper)."),
    ("load_seconds", "Seconds spent loading promoted KV back."),
)
# The disk tier's: (stats key, name in localradix_kv_tier_disk_<name>_total, help).
DISK_COUNTERS = (
    ("disk_hit_tokens", "hit_tokens", "Promoted KV tokens read from disk."),
    ("disk_files_written", "files_written", "Chunk files written to the disk tier."),
    ("disk_bytes_written", "bytes_written", "Bytes written to the disk tier."),
    ("disk_corrupt", "corrupt_files", "Disk tier files found corrupt, skipped and deleted."),
    (
        "disk_dropped",
        "dropped_writes",
        "Chunks not written to disk: the writer was too far behind.",
    ),
)


class Histogram:
    def __init__(self, name: str, help: str, buckets: Sequence[float]) -> None:
        self.name, self.help = f"{PREFIX}_{name}", help
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # last = +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.sum += value * times
        self.count += times

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts[:-1], strict=True):
            cumulative += count
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum {self.sum}")
        lines.append(f"{self.name}_count {self.count}")
        return lines


def _metric(kind: str, name: str, help: str, value: float, labels: str = "") -> list[str]:
    full = f"{PREFIX}_{name}"
    return [f"# HELP {full} {help}", f"# TYPE {full} {kind}", f"{full}{labels} {value}"]


class ServerMetrics:
    def __init__(self) -> None:
        self.ttft = Histogram(
            "time_to_first_token_seconds", "Time to first token.", LATENCY_BUCKETS
        )
        self.itl = Histogram("inter_token_latency_seconds", "Time between tokens.", LATENCY_BUCKETS)
        self.e2e = Histogram("e2e_request_latency_seconds", "Request latency.", E2E_BUCKETS)
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.cached_tokens = 0
        self.requests: dict[str, int] = {}  # finish reason -> count
        self.errors: dict[int, int] = {}  # HTTP status -> count

    def record_finish(self, reason: str, prompt: int, generated: int, cached: int) -> None:
        self.requests[reason] = self.requests.get(reason, 0) + 1
        self.prompt_tokens += prompt
        self.generated_tokens += generated
        self.cached_tokens += cached

    def record_error(self, status: int) -> None:
        self.errors[status] = self.errors.get(status, 0) + 1

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def render(self, stats: EngineStats | None, in_flight: int, engine_alive: bool) -> str:
        s = stats or EngineStats()
        lines: list[str] = []
        lines += _metric(
            "gauge", "engine_up", "1 while the engine process runs.", int(engine_alive)
        )
        lines += _metric("gauge", "requests_running", "Requests being decoded.", s.running)
        lines += _metric("gauge", "requests_queued", "Requests waiting.", s.queued)
        lines += _metric(
            "gauge",
            "requests_in_flight",
            "Engine requests not finished, one per choice.",
            in_flight,
        )
        lines += self._kv_lines(s)
        hits, misses = s.cache_hit_tokens, s.cache_miss_tokens
        rate = hits / (hits + misses) if hits + misses else self.cache_hit_rate
        lines += _metric("gauge", "cache_hit_rate", "Share of prompt tokens found in cache.", rate)
        lines += _metric("counter", "prompt_tokens_total", "Prompt tokens.", self.prompt_tokens)
        lines += _metric(
            "counter", "generation_tokens_total", "Generated tokens.", self.generated_tokens
        )
        lines += _metric(
            "counter", "cached_tokens_total", "Cached prompt tokens.", self.cached_tokens
        )
        lines += _metric("counter", "retractions_total", "Requests retracted.", s.retractions)
        lines += self._speculation_lines(s)
        lines += self._snapshot_lines(s)
        lines += self._tier_lines(s.kv_tiers)
        lines += self._labelled(
            "requests_total", "Finished requests.", "finish_reason", self.requests
        )
        lines += self._labelled("http_errors_total", "Error responses.", "status", self.errors)
        lines += _metric(
            "gauge", "prefill_tokens_per_second", "Prefill rate.", s.prefill_tokens_per_s
        )
        lines += _metric("gauge", "decode_tokens_per_second", "Decode rate.", s.decode_tokens_per_s)
        for hist in (self.ttft, self.itl, self.e2e):
            lines += hist.render()
        return "\n".join(lines) + "\n"

    @staticmethod
    def _speculation_lines(s: EngineStats) -> list[str]:
        """--speculative: verify steps, drafted and accepted tokens, and their ratio."""
        drafted, accepted = s.spec_draft_tokens, s.spec_accepted_tokens
        return [
            *_metric(
                "counter",
                "spec_verify_steps_total",
                "Steps that verified drafts.",
                s.spec_verify_steps,
            ),
            *_metric("counter", "spec_draft_tokens_total", "Draft tokens verified.", drafted),
            *_metric("counter", "spec_accepted_tokens_total", "Draft tokens accepted.", accepted),
            *_metric(
                "gauge",
                "spec_acceptance_rate",
                "Accepted share of the draft tokens.",
                accepted / drafted if drafted else 0.0,
            ),
        ]

    @staticmethod
    def _snapshot_lines(s: EngineStats) -> list[str]:
        """Models with recurrent layers: state snapshots at radix nodes (resume points)."""
        return [
            *_metric("gauge", "state_snapshots", "State snapshots kept.", s.snapshots),
            *_metric(
                "gauge", "state_snapshot_bytes", "Bytes of state snapshots.", s.snapshot_bytes
            ),
            *_metric(
                "counter",
                "state_snapshot_hits_total",
                "Requests resumed from a state snapshot.",
                s.snapshot_hits,
            ),
            *_metric(
                "counter",
                "state_snapshot_miss_tokens_total",
                "Cached prompt tokens past the last snapshot on a request's path (recomputed).",
                s.snapshot_miss_tokens,
            ),
        ]

    @staticmethod
    def _tier_lines(tiers: dict[str, Any]) -> list[str]:
        """--kv-host-gib / --kv-disk-cache: the tiers below the tree (`KVTiers.stats()`);
        nothing when they are off."""
        if not tiers:
            return []
        name = f"{PREFIX}_kv_tier_bytes"
        lines = [
            f"# HELP {name} Bytes of KV in each tier below the radix tree (disk: the whole folder).",
            f"# TYPE {name} gauge",
        ]
        for tier in ("host", "disk"):
            if f"{tier}_bytes" in tiers:
                lines.append(f'{name}{{tier="{tier}"}} {tiers[f"{tier}_bytes"]}')
        for key, help in TIER_COUNTERS:
            lines += _metric("counter", f"kv_tier_{key}_total", help, tiers.get(key, 0))
        if "disk_bytes" not in tiers:
            return lines
        lines += _metric(
            "gauge",
            "kv_tier_disk_budget_bytes",
            "Byte budget of the disk tier's folder (every model's files).",
            tiers.get("disk_budget", 0),
        )
        for key, short, help in DISK_COUNTERS:
            lines += _metric("counter", f"kv_tier_disk_{short}_total", help, tiers.get(key, 0))
        return lines

    @staticmethod
    def _kv_lines(s: EngineStats) -> list[str]:
        name = f"{PREFIX}_kv_tokens"
        lines = [f"# HELP {name} KV cache slots by state.", f"# TYPE {name} gauge"]
        for state, value in (
            ("used", s.kv_used),
            ("cached", s.kv_cached),
            ("free", s.kv_free),
            ("total", s.kv_total),
        ):
            lines.append(f'{name}{{state="{state}"}} {value}')
        usage = s.kv_used / s.kv_total if s.kv_total else 0.0
        lines += _metric("gauge", "kv_usage", "Share of KV held by requests.", usage)
        pinned_help = "KV tokens pinned by cache_control (counted in used)."
        return lines + _metric("gauge", "kv_pinned_tokens", pinned_help, s.kv_pinned)

    @staticmethod
    def _labelled(name: str, help: str, label: str, values: dict) -> list[str]:
        full = f"{PREFIX}_{name}"
        lines = [f"# HELP {full} {help}", f"# TYPE {full} counter"]
        lines += [f'{full}{{{label}="{k}"}} {v}' for k, v in sorted(values.items())]
        return lines
