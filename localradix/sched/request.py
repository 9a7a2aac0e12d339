"""A request's life inside the engine: tokens, KV bookkeeping and finish state.

Slot ownership (DESIGN §5): slots `table[row, :cached_len]` belong to the radix tree (kept alive
by the lock on `last_node`); slots `table[row, cached_len:kv_len]` belong to the request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from localradix.messages import CachePin, Embed, ErrorCode, TokenLogprob
from localradix.sampling_params import SamplingParams

_NO_DRAFTS = np.zeros(0, dtype=np.int64)


class ReqState(Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    rid: str
    prompt_ids: np.ndarray  # int64
    params: SamplingParams
    extra_key: str | None = None
    require_cached_tokens: int = 0  # GenerateRequest's: this much prompt must be cached
    pins: tuple[CachePin, ...] = ()  # applied (then cleared) once the prompt is cached
    output_ids: list[int] = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    # KV bookkeeping
    row: int | None = None  # row in the ReqToTokenPool table
    last_node: Any = None  # radix node locked on behalf of this request
    cached_len: int = 0  # prefix owned by the tree
    kv_len: int = 0  # tokens whose KV is computed
    extend_len: int = 0  # tokens scheduled in the current extend step
    prefix_match: Any = None  # MatchResult of the latest match (for scheduling and TUI)
    # Models with recurrent layers: how far the tree matched the prompt at the latest match
    # (past the snapshot it resumes from); its prefill stops there first to take a snapshot.
    branch_at: int = 0
    snapshot_stride: int = 0  # ...and when it found nothing cached, it snapshots every this many
    tier_miss_at: int = -1  # the cached length at which the tiers below the tree had nothing
    grammar_future: Any = None  # Future of the compiled constraint, while it compiles
    grammar: Any = None  # GrammarState once compiled
    # Overlap scheduling: tokens sampled by launched steps that the host has not read yet, the
    # runner's placeholder for the newest one (the next step's input), and an epoch that
    # retraction bumps so that results launched before it are dropped.
    pending: int = 0
    placeholder: int = 0
    epoch: int = 0
    # Speculative decoding (sched/speculation.py): this step's drafts, the draft positions
    # written but not verified yet (their slots are owned too), the drafter and adaptive k.
    draft_ids: np.ndarray = field(default_factory=lambda: _NO_DRAFTS)
    spec_len: int = 0
    spec: Any = None  # RequestSpec once it decodes with --speculative
    # Embedding requests (sched/embedding.py): prefill only, pooled chunk by chunk.
    embed: Embed | None = None
    pooled: np.ndarray | None = None  # float32 [hidden]: pooled over the chunks run so far
    embedding: tuple[float, ...] | None = None  # the answer, once the prompt is all in
    # Reporting
    cached_tokens: int = -1  # prompt tokens served from cache at first admission
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    error: str | None = None
    error_code: ErrorCode | None = None
    retractions: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    sent_tokens: int = 0  # output tokens already reported
    sent_logprobs: int = 0

    @property
    def all_ids(self) -> np.ndarray:
        """Prompt plus output. A step computes KV for `all_ids[kv_len:]` (one token in decode)."""
        if not self.output_ids:
            return self.prompt_ids
        return np.concatenate([self.prompt_ids, np.asarray(self.output_ids, np.int64)])

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining_new_tokens(self) -> int:
        return max(self.params.max_new_tokens - len(self.output_ids) - self.pending, 0)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def finish(self, reason: str, matched: int | str | None = None) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.matched_stop = matched

    def fail(self, message: str, code: ErrorCode) -> None:
        self.error, self.error_code = message, code
        self.finish("error")
