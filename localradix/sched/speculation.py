"""Speculative decoding in the loop (`--speculative ngram`): before a decode step, each request
may get up to k n-gram drafts (`spec.NgramDrafter`); it then runs `[last] + drafts` as one extend
in the same batch, every position is sampled (`ForwardBatch.num_sampled`), and on read the
longest prefix of drafts equal to the sampled tokens is kept plus the token after it
(`spec.accept`). Output is the same as without speculation: only the step count changes.

Which requests speculate: decode requests whose tokens are all on the host, that did not opt
out (`SamplingParams.speculative`), with room for k more tokens, and only while the pool has
free slots for the drafts (drafts never evict the cache nor retract anyone). How many: the k
that maximises the request's expected tokens per unit of step cost (`spec.best_draft_len`),
from its acceptance so far and what a draft row costs on this runner (`spec.StepCostModel`,
fitted on the decode and verify steps' measured times), so 0 when drafting would not pay. A grammar request
drafts only the tokens its grammar allows (`spec.draft_masks`). The KV of rejected drafts goes
back to the pool at the read (`SlotHandoff.drop_rejected`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from localradix.mem.radix_cache import RadixCache
from localradix.sched.request import Req, ReqState
from localradix.sched.sched_config import SchedulerConfig
from localradix.sched.slot_handoff import SlotHandoff
from localradix.spec import (
    AdaptiveConfig,
    AdaptiveK,
    NgramConfig,
    NgramDrafter,
    RollbackGrammar,
    StepCostModel,
    TreeContinuations,
    Verdict,
    accept,
    best_draft_len,
    draft_masks,
)

logger = logging.getLogger("localradix.scheduler")

_NO_DRAFTS = np.zeros(0, dtype=np.int64)


@dataclass
class RequestSpec:
    """A request's drafter (fed every token it emits) and its acceptance record."""

    drafter: NgramDrafter
    adaptive: AdaptiveK
    # Grammar requests: mask rows after each kept draft (`draft_masks`), for this step's rows.
    masks: np.ndarray | None = None
    # Drafts proposed while k = 0 (not run): scored against the tokens that come next.
    shadow: np.ndarray = field(default_factory=lambda: _NO_DRAFTS)
    shadow_matched: int = 0

    def score_shadow(self, tokens: list[int]) -> None:
        """Compare the shadow drafts with the tokens emitted after them; once they are decided
        (one differs, or all matched), they count towards the acceptance estimate."""
        for token in tokens:
            if not len(self.shadow):
                return
            if token != self.shadow[self.shadow_matched]:
                self._close_shadow()
            else:
                self.shadow_matched += 1
                if self.shadow_matched == len(self.shadow):
                    self._close_shadow()

    def _close_shadow(self) -> None:
        self.adaptive.score(len(self.shadow), self.shadow_matched)
        self.shadow, self.shadow_matched = _NO_DRAFTS, 0


@dataclass(eq=False)
class Speculator:
    args: SchedulerConfig
    slots: SlotHandoff
    cache: RadixCache
    context_len: int
    vocab_size: int
    enabled: bool
    _ngram: NgramConfig = field(init=False)
    _adaptive: AdaptiveConfig = field(init=False)
    _tree: TreeContinuations = field(init=False)
    costs: StepCostModel = field(default_factory=StepCostModel, init=False)
    _said: set[str] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        k_max = max(self.args.speculative_k, 1)
        m = self.args.speculative_min_match
        self._ngram = NgramConfig(min_match=m, max_match=max(8, m))
        # Whether a draft pays is the cost model's call (`best_draft_len`); the adaptive
        # switch-off only stops drafting (and its host work) for hopeless requests.
        self._adaptive = AdaptiveConfig(k_max=k_max, k_start=min(4, k_max), min_acceptance=0.2)
        self._tree = TreeContinuations(self.cache, min_match=m, max_match=max(8, m))

    def draft(self, batch: list[Req]) -> None:
        """Give each eligible decode request of the batch its drafts for this step and the
        slots to write them to (`extend_len` becomes 1 + drafts)."""
        room = True
        work = plain_work(batch)
        for req in batch:
            req.drafts.ids = _NO_DRAFTS
            if not self.enabled or not self._eligible(req):
                continue
            spec, k = req.drafts.spec, self.draft_len(req, work)
            assert spec is not None  # `_eligible` gave it one
            if k == 0 and not len(spec.shadow):  # would not pay: keep them to score
                spec.shadow = self._propose(req, self._adaptive.k_max, grammar=False)
            drafts = self._propose(req, k) if k else _NO_DRAFTS
            if not len(drafts):
                continue
            # (the reservation schedules the drafts: `extend_len` = 1 + drafts)
            room = room and self.slots.reserve_drafts(req, len(drafts))
            if room:  # once the pool is short, nobody else drafts this step either
                req.drafts.ids = drafts

    def settle(self, req: Req, drafts: np.ndarray, verdict: Verdict, taken: int) -> None:
        """After the read: `taken` of the step's emitted tokens were kept (fewer than all when
        the request stopped mid-verdict). Drop the rejected drafts' KV and learn from it."""
        spec = req.drafts.spec
        if len(drafts):
            assert spec is not None  # it drafted
            launch_kv_len = req.hold.kv_len - 1
            self.slots.drop_rejected(req, launch_kv_len + taken)
            spec.adaptive.record(len(drafts), verdict.accepted)
            spec.masks = None
        if spec is not None:
            tokens = verdict.tokens(drafts)[:taken].tolist()
            spec.drafter.append(tokens)
            spec.score_shadow(tokens)

    def draft_len(self, req: Req, work: tuple[int, float]) -> int:
        """How many drafts pay for themselves for `req` in a step whose plain decode runs
        `work` = (rows, context tokens read): 0 when none does, at most `--speculative-k`."""
        if req.drafts.spec is None:  # no verdict yet: the prior acceptance
            alpha, k_max = AdaptiveK(self._adaptive).alpha, self._adaptive.k_max
        else:
            adaptive = req.drafts.spec.adaptive
            alpha, k_max = adaptive.alpha, self._adaptive.k_max if adaptive.enabled else 0
        return best_draft_len(alpha, self.costs.beta(*work, context=req.hold.kv_len), k_max)

    def drafts_next(self, batch: list[Req]) -> bool:
        """Whether a request of the batch may draft at its next step. Its drafts continue from
        this step's tokens, so with overlap the next step waits for them (overlap pauses while
        it drafts): a request whose drafts would not pay keeps the overlap."""
        if not self.enabled:
            return False
        work = plain_work(batch)
        return any(self._may_draft(r) and self.draft_len(r, work) > 0 for r in batch)

    def observe(self, work: tuple[int, float], seconds: float) -> None:
        """A decode or verify step ran `work` = (rows, context tokens read) in `seconds`."""
        if self.enabled:
            self.costs.observe(*work, seconds)

    def _may_draft(self, req: Req) -> bool:
        if not req.ask.params.speculative or req.hold.state != ReqState.DECODE:
            return False
        return req.remaining_new_tokens > 1

    # ---- internals -------------------------------------------------------------------------

    def _eligible(self, req: Req) -> bool:
        if req.hold.state != ReqState.DECODE or req.hold.extend_len != 1 or req.progress.pending:
            return False
        if not req.ask.params.speculative:
            return False
        if req.constraint.grammar is not None and not hasattr(req.constraint.grammar, "rollback"):
            self._say_once("grammar", "a grammar that cannot roll back: no drafts for it")
            return False
        if req.drafts.spec is None:  # its first decode: index its context in one go
            drafter = NgramDrafter(self._ngram, req.all_ids, self._tree, req.ask.extra_key)
            req.drafts.spec = RequestSpec(drafter, AdaptiveK(self._adaptive))
        return True

    def _propose(self, req: Req, k: int, grammar: bool = True) -> np.ndarray:
        room = min(req.remaining_new_tokens - 1, self.context_len - req.seq_len - 1)
        k = min(k, room)
        if k <= 0:
            return _NO_DRAFTS
        spec, rules = req.drafts.spec, req.constraint.grammar
        assert spec is not None
        drafts = np.asarray(spec.drafter.propose(k).tokens, dtype=np.int64)
        if grammar and rules is not None and len(drafts):
            masks = np.full((len(drafts) + 1, (self.vocab_size + 31) // 32), -1, dtype=np.int32)
            kept = draft_masks(cast(RollbackGrammar, rules), drafts, masks, 0)  # (`_eligible`)
            drafts = drafts[:kept]
            spec.masks = masks[: kept + 1]
        return drafts

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            logger.info("Speculative decoding: %s", message)


def clear_drafts(batch: list[Req]) -> None:
    """The batch launched: its drafts are in its KV now (`spec_len`), verified at the read."""
    for req in batch:
        req.drafts.ids = _NO_DRAFTS


def plain_work(batch: list[Req]) -> tuple[int, float]:
    """(rows, context tokens read) of the batch decoding without drafts (a mixed batch's
    prefill rows are left out: drafts then look dearer than they are, never cheaper)."""
    return len(batch), float(sum(r.hold.kv_len + 1 for r in batch))


def step_work(batch: list[Req]) -> tuple[int, float]:
    """(rows, context tokens read) of a decode step as launched, drafts included: request i's
    1 + k_i rows read about its kv_len tokens each."""
    rows = sum(1 + len(r.drafts.ids) for r in batch)
    return rows, float(sum((1 + len(r.drafts.ids)) * (r.hold.kv_len + 1) for r in batch))


def verdict_of(drafts: np.ndarray, targets: np.ndarray) -> Verdict:
    """The step's verdict for one request: `targets` are its sampled rows (k + 1 of them)."""
    if not len(drafts):
        return Verdict(0, int(targets[0]))
    return accept(drafts, targets)
