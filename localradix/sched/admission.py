"""Prefill admission: which waiting requests (and which chunk of the chunked one) prefill now.

Prefill has priority over decode. The budget (`PrefillBudget`) is free + evictable KV minus
what running requests will likely need to decode; the waiting queue is ordered by the
schedule policy; one long prompt at a time is prefilled in chunks. A step takes as many prompt
tokens as `PrefillPace` allows (a time budget, from the measured prefill speed); while a long
prompt is chunked, the requests that arrive meanwhile and fit whole go first, and the chunk
takes what is left (at least a minimum, so the long prompt always moves on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from localradix.messages import ErrorCode
from localradix.sched.policy import PrefillBudget, order_waiting
from localradix.sched.prefill_pace import MIN_STEP_TOKENS, PrefillPace
from localradix.sched.queues import RequestQueues
from localradix.sched.request import Req
from localradix.sched.sched_config import SchedulerConfig
from localradix.sched.slot_handoff import SlotHandoff
from localradix.sched.stats import SchedulerStats

Verdict = Literal["ok", "skip", "stop"]


@dataclass(eq=False)
class PrefillAdmission:
    args: SchedulerConfig
    queues: RequestQueues
    slots: SlotHandoff
    stats: SchedulerStats
    pace: PrefillPace | None = None  # None: fixed --chunked-prefill-size chunks
    _yielded: bool = False  # the chunk sat the last step out for newcomers

    def admit(self, new_token_ratio: float) -> list[Req]:
        """The requests that prefill in this step (empty when none fits), moved out of the
        waiting queue with their slots reserved."""
        q = self.queues
        if q.chunked is None and (
            not q.waiting or len(q.running) >= self.args.max_running_requests
        ):
            return []
        budget = self._budget(new_token_ratio)
        chunked = q.chunked
        self._admit_waiting(budget)  # with a chunk in flight: only whole prompts, before it
        if chunked is not None and self._chunk_yields(budget):
            pass  # newcomers alone: their first tokens come after this short step
        elif chunked is not None and not self._continue_chunk(budget) and not budget.admitted:
            return []
        if chunked is not None and q.chunked is None:  # its last chunk: others may now chunk
            self._admit_waiting(budget)
        admitted = set(map(id, budget.admitted))
        q.waiting = [r for r in q.waiting if id(r) not in admitted and not r.finished]
        if budget.admitted:
            self.stats.log_prefill(budget.admitted)
        return budget.admitted

    def _chunk_yields(self, budget: PrefillBudget) -> bool:
        """Whether the long prompt's chunk sits this step out so the newcomers admitted run in
        a short step of their own; never twice running, so the long prompt keeps moving."""
        yields = bool(budget.admitted) and not self._yielded
        self._yielded = yields
        return yields

    def _admit_waiting(self, budget: PrefillBudget) -> None:
        q, limit = self.queues, self.args.max_running_requests
        for req in order_waiting(q.waiting, self.args.schedule_policy, self.slots.match):
            if len(q.running) + len(budget.admitted) >= limit:
                break
            if req in budget.admitted or req is q.chunked:
                continue
            if self._try_admit(req, budget) == "stop":
                break

    def _budget(self, ratio: float) -> PrefillBudget:
        cache = self.slots.cache
        step = self.pace.step_tokens() if self.pace else self.args.chunked_prefill_size
        return PrefillBudget(
            available=self.slots.pool.available + cache.evictable_size,
            reserved=sum(r.remaining_new_tokens * ratio for r in self.queues.running),
            max_prefill_tokens=min(
                self.args.max_prefill_tokens, step or self.args.max_prefill_tokens
            ),
            chunk_size=step,
            new_token_ratio=ratio,
        )

    def _continue_chunk(self, budget: PrefillBudget) -> bool:
        """Schedule the next chunk of the chunked prefill; False if its slots do not fit."""
        req = self.queues.chunked
        assert req is not None
        key = req.all_ids
        todo = len(key) - req.hold.kv_len
        # When the step's tokens went to newcomers, the chunk still takes a minimum: the long
        # prompt moves on every step it can.
        fallback = max(budget.chunk_size, 1)
        if budget.prefill_left <= 0:
            fallback = min(fallback, MIN_STEP_TOKENS)
        extend = budget.extend_size(req, todo) or min(todo, fallback)
        extend = self.slots.align_chunk(extend, todo) or min(todo, self.slots.page)
        extend = self.slots.snapshot_cap(req, req.hold.kv_len, extend)
        if not self.slots.reserve(req, extend):
            return False
        self.slots.start_extend(req, extend)
        self.queues.chunked = req if extend < todo else None
        budget.take(req, extend, key, finishes_prompt=extend == todo)
        return True

    def _try_admit(self, req: Req, budget: PrefillBudget) -> Verdict:
        """Admit `req` into the batch if it fits: 'ok', 'skip' (try the next one) or 'stop'."""
        self.slots.match(req, promote=True)  # fresh: an earlier admission may have evicted nodes
        key = req.all_ids
        match = req.hold.prefix_match
        assert match is not None
        if not self._has_required_prefix(req, match.matched_len):
            return "skip"
        # Always compute >= 1 token (for logits), and start on a page boundary.
        page = self.slots.page
        cached = min(match.matched_len, len(key) - 1) // page * page
        if budget.shares_new_prefix(key, cached):
            return "skip"
        todo = len(key) - cached
        extend = self.slots.align_chunk(budget.extend_size(req, todo), todo)
        extend = self.slots.snapshot_cap(req, cached, extend)
        if extend == 0:
            return "stop"
        if extend < todo and self.queues.chunked is not None:
            return "skip"  # one chunked prefill in flight at a time
        evictable_before = self.slots.cache.evictable_size
        if not self.slots.claim(req, match, cached, extend):
            return "stop"
        budget.room -= evictable_before - self.slots.cache.evictable_size  # locked, not free
        self.slots.start_extend(req, extend)
        if req.hold.cached_tokens < 0:  # its first admission (not a retracted request's return)
            self.slots.first_admission(req, cached)
            self.stats.hits.record(cached, len(req.ask.prompt_ids) - cached)
            self.stats.note_miss(req, match)
        if extend < todo:
            self.queues.chunked = req
        budget.take(req, extend, key, finishes_prompt=extend == todo)
        return "ok"

    def _has_required_prefix(self, req: Req, matched: int) -> bool:
        """A continuation that must be served from the cache (`require_cached_tokens`, whole
        pages only, as the tree keeps them) fails with PREFIX_EVICTED once the cache lost that
        prefix, rather than being prefilled again without the client knowing."""
        page = self.slots.page
        required = req.ask.require_cached_tokens // page * page
        if req.hold.cached_tokens >= 0 or matched >= required:  # checked at its first admission
            return True
        req.fail(
            f"only {matched} of the {required} prompt tokens this continuation needs cached are "
            "still in the radix cache (the rest was evicted); resend the whole input",
            ErrorCode.PREFIX_EVICTED,
        )
        self.queues.touch(req)
        return False
