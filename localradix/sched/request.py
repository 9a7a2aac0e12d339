"""A request's life inside the engine, as typed parts with one writer each.

`Req` holds nine parts. Each part is a small dataclass whose fields one module assigns (its
`WRITERS`; none when only the part's own methods write it); `tests/sched/test_one_writer.py`
checks that rule over `localradix/`. Other modules read the parts and ask the writer to change
them.

Slot ownership (docs/architecture.md): slots `table[row, :cached_len]` belong to the radix tree (kept alive
by the lock on `last_node`); slots `table[row, cached_len:kv_len + spec_len]` belong to the
request.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from localradix.mem.radix_node import MatchResult, TreeNode
from localradix.messages import CachePin, Embed, ErrorCode, TokenLogprob
from localradix.sampling_params import SamplingParams

if TYPE_CHECKING:
    from localradix.constrained.backend import GrammarMatcherState
    from localradix.sched.speculation import RequestSpec

_NO_DRAFTS = np.zeros(0, dtype=np.int64)


class ReqState(Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


@dataclass(frozen=True, eq=False)
class Ask:
    """What was asked: fixed once intake has built it (max_new_tokens already clamped to the
    context). Frozen, so nothing writes it."""

    WRITERS: ClassVar[tuple[str, ...]] = ()

    rid: str
    prompt_ids: np.ndarray  # int64
    params: SamplingParams
    extra_key: str | None = None
    require_cached_tokens: int = 0  # GenerateRequest's: this much prompt must be cached
    embed: Embed | None = None  # an embedding request (sched/embedding.py): prefill only
    arrival_time: float = field(default_factory=time.monotonic)


@dataclass
class PinsDue:
    """Cache pins still to apply: applied once the prompt is cached, then dropped."""

    WRITERS: ClassVar[tuple[str, ...]] = ("localradix.sched.pins",)

    due: tuple[CachePin, ...] = ()


@dataclass(eq=False)
class CacheHold:
    """What the cache holds for the request, and where it stands in scheduling: its row, the
    lock on its tree path, its computed and scheduled KV (docs/architecture.md, "Slot ownership")."""

    WRITERS: ClassVar[tuple[str, ...]] = ("localradix.sched.slot_handoff",)

    state: ReqState = ReqState.WAITING
    row: int | None = None  # row in the ReqToTokenPool table
    last_node: TreeNode | None = None  # radix node locked on behalf of this request
    cached_len: int = 0  # prefix owned by the tree
    kv_len: int = 0  # tokens whose KV is computed
    extend_len: int = 0  # tokens scheduled (slots reserved) in the current extend step
    spec_len: int = 0  # draft positions written but not verified yet (their slots are owned)
    prefix_match: MatchResult | None = None  # the latest match (for scheduling and the TUI)
    # Models with recurrent layers: how far the tree matched the prompt at the latest match
    # (past the snapshot it resumes from); its prefill stops there first to take a snapshot.
    branch_at: int = 0
    snapshot_stride: int = 0  # ...and when it found nothing cached, it snapshots every this many
    tier_miss_at: int = -1  # the cached length at which the tiers below the tree had nothing
    cached_tokens: int = -1  # prompt tokens served from cache at first admission


@dataclass(eq=False)
class Drafts:
    """Speculative decoding (sched/speculation.py): this step's drafts, and the drafter with
    its acceptance record once the request decodes with --speculative."""

    WRITERS: ClassVar[tuple[str, ...]] = ("localradix.sched.speculation",)

    ids: np.ndarray = field(default_factory=lambda: _NO_DRAFTS)
    spec: RequestSpec | None = None


@dataclass
class Progress:
    """Decode progress: the tokens read so far and the steps still in flight. Overlap
    scheduling: `pending` tokens sampled by launched steps that the host has not read yet,
    `placeholder` the runner's stand-in for the newest one (the next step's input), and an
    `epoch` that retraction bumps so that results launched before it are dropped."""

    WRITERS: ClassVar[tuple[str, ...]] = ("localradix.sched.launch",)

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    first_token_time: float | None = None
    pending: int = 0
    placeholder: int = 0
    epoch: int = 0
    retractions: int = 0

    def retracted(self) -> None:
        """Sent back to the queue: its tokens in flight are dropped, and it is counted."""
        self.pending, self.epoch = 0, self.epoch + 1
        self.retractions += 1


@dataclass
class Constraint:
    """A constrained request's grammar: the compile's future, then the matcher state."""

    WRITERS: ClassVar[tuple[str, ...]] = ("localradix.sched.intake",)

    future: Future[Any] | None = None
    grammar: GrammarMatcherState | None = None


@dataclass(eq=False)
class Pooling:
    """Embedding requests (sched/embedding.py): pooled chunk by chunk, then the answer."""

    WRITERS: ClassVar[tuple[str, ...]] = ("localradix.sched.launch",)

    pooled: np.ndarray | None = None  # float32 [hidden]: pooled over the chunks run so far
    embedding: tuple[float, ...] | None = None  # the answer, once the prompt is all in


@dataclass
class Outcome:
    """How the request ended. Only `finish` and `fail` write it: the first reason wins."""

    WRITERS: ClassVar[tuple[str, ...]] = ()

    finish_reason: str | None = None
    matched_stop: int | str | None = None
    error: str | None = None
    error_code: ErrorCode | None = None

    def finish(self, reason: str, matched: int | str | None = None) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.matched_stop = matched

    def fail(self, message: str, code: ErrorCode) -> None:
        self.error, self.error_code = message, code
        self.finish("error")


@dataclass
class Reported:
    """How much of the output the engine has already reported back."""

    WRITERS: ClassVar[tuple[str, ...]] = ("localradix.sched.queues",)

    sent_tokens: int = 0
    sent_logprobs: int = 0


@dataclass(eq=False, frozen=True)
class Req:
    """One engine request: its parts (fixed at intake; each part is written by its owner)."""

    ask: Ask
    pinning: PinsDue = field(default_factory=PinsDue)
    hold: CacheHold = field(default_factory=CacheHold)
    drafts: Drafts = field(default_factory=Drafts)
    progress: Progress = field(default_factory=Progress)
    constraint: Constraint = field(default_factory=Constraint)
    pooling: Pooling = field(default_factory=Pooling)
    outcome: Outcome = field(default_factory=Outcome)
    report: Reported = field(default_factory=Reported)

    @classmethod
    def of(
        cls,
        rid: str,
        prompt_ids: np.ndarray,
        params: SamplingParams,
        pins: tuple[CachePin, ...] = (),
        **ask: Any,
    ) -> Req:
        """A fresh request (`ask`: the rest of `Ask`'s fields)."""
        return cls(Ask(rid, prompt_ids, params, **ask), PinsDue(pins))

    @property
    def all_ids(self) -> np.ndarray:
        """Prompt plus output. A step computes KV for `all_ids[kv_len:]` (one token in decode)."""
        out = self.progress.output_ids
        if not out:
            return self.ask.prompt_ids
        return np.concatenate([self.ask.prompt_ids, np.asarray(out, np.int64)])

    @property
    def seq_len(self) -> int:
        return len(self.ask.prompt_ids) + len(self.progress.output_ids)

    @property
    def remaining_new_tokens(self) -> int:
        made = len(self.progress.output_ids) + self.progress.pending
        return max(self.ask.params.max_new_tokens - made, 0)

    @property
    def finished(self) -> bool:
        return self.outcome.finish_reason is not None

    def finish(self, reason: str, matched: int | str | None = None) -> None:
        self.outcome.finish(reason, matched)

    def fail(self, message: str, code: ErrorCode) -> None:
        self.outcome.fail(message, code)
