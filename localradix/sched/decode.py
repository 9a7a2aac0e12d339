"""Decode batches and retraction: every running request decodes one token per step; when the
KV pool cannot hold the step, requests go back to the queue (their prefix stays cached).

`new_token_ratio` (the share of each running request's remaining max_tokens that admission
reserves for it) decays while decoding goes fine and resets after a retraction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from localradix.sched.queues import RequestQueues
from localradix.sched.request import Req
from localradix.sched.sched_config import SchedulerConfig
from localradix.sched.slot_handoff import SlotHandoff
from localradix.sched.stats import SchedulerStats

logger = logging.getLogger("localradix.scheduler")

MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # decode steps for the ratio to decay from init to min


@dataclass(eq=False)
class DecodePlanner:
    args: SchedulerConfig
    queues: RequestQueues
    slots: SlotHandoff
    stats: SchedulerStats
    context_len: int
    new_token_ratio: float = field(init=False)

    def __post_init__(self) -> None:
        self.new_token_ratio = self.args.new_token_ratio

    def plan(self) -> list[Req]:
        """The decode batch of this step, retracting requests until its slots fit."""
        batch = self._decodable()
        pool, cache = self.slots.pool, self.slots.cache
        while batch and pool.available + cache.evictable_size < self.slots.decode_need(batch):
            self._retract_one()
            batch = self._decodable()
        if not batch:
            return []
        opened = self.slots.open_decode_pages(batch)
        assert opened, "decode room was checked just above"
        step = (self.args.new_token_ratio - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = max(self.new_token_ratio - step, MIN_NEW_TOKEN_RATIO)
        return batch

    def ride_along(self) -> list[Req]:
        """With --mixed-prefill, the running requests decode in the prefill's step too, if
        their slots fit without retracting anyone (else they wait, as without mixing)."""
        batch = self._decodable()
        if not batch or not self.slots.open_decode_pages(batch):
            return []
        return batch

    def _decodable(self) -> list[Req]:
        """Running requests not already certain to stop at a token still on the device."""
        return [
            r
            for r in self.queues.running
            if r.remaining_new_tokens > 0 and r.seq_len + r.progress.pending < self.context_len
        ]

    def _retract_one(self) -> None:
        """Send the request with the fewest generated tokens back to the queue, prefix cached
        (the last one left: drop the cache pins first, then stop it where the pool ends)."""
        running = self.queues.running
        if len(running) == 1 and self.slots.cache.pins:  # pins give way before a request
            logger.warning("KV cache full: dropping %d cache pins", len(self.slots.cache.pins))
            self.slots.cache.unpin_all()
            return
        if len(running) == 1:  # nothing left to retract: stop it where the pool ends
            req = running.pop()
            total = self.slots.pool.total
            logger.warning("KV cache full (%d tokens): %s stops early", total, req.ask.rid)
            req.finish("length")
            self.slots.release(req)
            self.queues.touch(req)
            return
        victim = min(running, key=lambda r: (len(r.progress.output_ids), -len(r.ask.prompt_ids)))
        running.remove(victim)
        self.slots.retract(victim)
        victim.progress.retracted()  # its token in flight is dropped
        self.queues.waiting.insert(0, victim)
        self.stats.retractions += 1
        self.new_token_ratio = self.args.new_token_ratio
        logger.info("Retracted %s (KV full); #running: %d", victim.ask.rid, len(running))
