"""The scheduler's own settings: the part of `ServerArgs` it reads, taken in one place.

The engine builds it once (`SchedulerConfig.from_args`); the scheduler and its rooms
(admission, decode planning, speculation) read only this, so what can change the scheduling is
visible here and a test states just what it sets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from localradix.config import ServerArgs


@dataclass(frozen=True)
class SchedulerConfig:
    page_size: int
    max_running_requests: int
    schedule_policy: str
    eviction_policy: str
    disable_radix_cache: bool
    max_cached_tokens: int | None
    chunked_prefill_size: int
    max_prefill_tokens: int
    step_budget_ms: float
    new_token_ratio: float
    mixed_prefill: str
    decode_log_interval: int
    speculative: str | None
    speculative_k: int
    speculative_min_match: int

    @classmethod
    def from_args(cls, args: ServerArgs) -> SchedulerConfig:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def of(cls, **settings: Any) -> SchedulerConfig:
        """The server's defaults with `settings` changed (for tests and tools)."""
        return cls.from_args(ServerArgs(**settings))
