"""One stats snapshot from `GET /v1/stats`, read tolerantly.

The server publishes `{"model": {...}, "uptime_s", "engine": <EngineStats fields>, "time",
"system"?: {...}}`. Anything missing or of the wrong type reads as None (rendered "–"), so an
older or newer server never crashes the TUI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localradix.tui.fmt import number

ENGINE_NUMBERS = (
    "running",
    "queued",
    "kv_total",
    "kv_used",
    "kv_cached",
    "kv_free",
    "cache_hit_tokens",
    "cache_miss_tokens",
    "prompt_tokens_total",
    "generated_tokens_total",
    "retractions",
    "spec_verify_steps",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "kv_pinned",
    "snapshots",
    "snapshot_bytes",
    "snapshot_hits",
    "snapshot_miss_tokens",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
)


def mapping(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def rows(v: Any) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(v, (list, tuple)):
        return ()
    return tuple(r for r in v if isinstance(r, Mapping))


@dataclass(frozen=True)
class Stats:
    """The parsed snapshot; `engine` numbers are floats or None."""

    model: Mapping[str, Any] = field(default_factory=dict)
    engine: Mapping[str, float | None] = field(default_factory=dict)
    requests: tuple[Mapping[str, Any], ...] = ()
    top_prefixes: tuple[Mapping[str, Any], ...] = ()
    recent_misses: tuple[Mapping[str, Any], ...] = ()
    kv_tiers: Mapping[str, Any] = field(default_factory=dict)  # host/disk tiers; {} when off
    system: Mapping[str, Any] = field(default_factory=dict)
    uptime_s: float | None = None
    time: float | None = None
    engine_alive: bool | None = None  # False: the API answers but its engine process is gone
    models: tuple[Mapping[str, Any], ...] = ()  # per model: name, state, memory, expires_at
    replicas: tuple[Mapping[str, Any], ...] = ()  # behind an smg gateway (tui/gateway.py)
    routing_hit_rate: float | None = None

    @classmethod
    def parse(cls, data: Any) -> Stats:
        data = mapping(data)
        eng = mapping(data.get("engine"))
        return cls(
            model=mapping(data.get("model")),
            engine={k: number(eng.get(k)) for k in ENGINE_NUMBERS},
            requests=rows(eng.get("requests")),
            top_prefixes=rows(eng.get("top_prefixes")),
            recent_misses=rows(eng.get("recent_misses")),
            kv_tiers=mapping(eng.get("kv_tiers")),
            system=mapping(data.get("system")),
            uptime_s=number(data.get("uptime_s")),
            time=number(data.get("time")),
            engine_alive=alive if isinstance(alive := data.get("engine_alive"), bool) else None,
            models=rows(data.get("models")),
            replicas=rows(data.get("replicas")),
            routing_hit_rate=number(data.get("routing_hit_rate")),
        )

    def get(self, key: str) -> float | None:
        """An engine number (see ENGINE_NUMBERS), or None."""
        return self.engine.get(key)

    def tier(self, key: str) -> float | None:
        """A number from `kv_tiers` (`KVTiers.stats()`: "disk_bytes", "promoted_tokens", ...)."""
        return number(self.kv_tiers.get(key))

    @property
    def busy(self) -> bool:
        return bool((self.get("running") or 0) + (self.get("queued") or 0))

    @property
    def hit_rate_total(self) -> float | None:
        hit, miss = self.get("cache_hit_tokens"), self.get("cache_miss_tokens")
        if hit is None or miss is None or hit + miss <= 0:
            return None
        return hit / (hit + miss)


def first(row: Mapping[str, Any], *keys: str) -> Any:
    """The first of `keys` present (not None) in `row`."""
    for k in keys:
        if row.get(k) is not None:
            return row[k]
    return None
