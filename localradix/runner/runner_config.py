"""A runner's own settings: the part of `ServerArgs` the runners and backends read, taken once.

`platform.build_runner` builds it from the resolved `ServerArgs` and hands it to the chosen
backend's `create_runner`; runners, their KV budget and tensor-parallel ranks read only this.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from localradix.config import ServerArgs


@dataclass(frozen=True)
class RunnerConfig:
    context_length: int | None  # None: the model's
    max_running_requests: int  # request rows the runner keeps (recurrent state, graphs)
    page_size: int
    max_total_tokens: int | None  # the KV pool; None: from memory (`kv_budget.py`)
    mem_fraction: float
    snapshot_mib: float | None
    tp: int
    threads: int | None  # llama.cpp's CPU threads
    quantize: str  # MLX: quantize float weights at load
    chunked_prefill_size: int  # llama.cpp sizes its batch for the scheduler's chunks
    max_prefill_tokens: int
    speculative: str | None  # llama.cpp keeps logits for draft verifies
    speculative_k: int
    log_level: str  # tensor-parallel workers log like the server

    @classmethod
    def from_args(cls, args: ServerArgs) -> RunnerConfig:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def of(cls, **settings: Any) -> RunnerConfig:
        """The server's defaults with `settings` changed (for tests and tools)."""
        return cls.from_args(ServerArgs(**settings))

    def replace(self, **changes: Any) -> RunnerConfig:
        return dataclasses.replace(self, **changes)
