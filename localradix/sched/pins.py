"""Cache pins (Anthropic cache_control, `GenerateRequest.pins`): applied once a request's prompt
is in the radix tree (it is inserted as the prefill launches), dropped when their deadline passes,
and kept within half the KV pool (and --max-cached-tokens) so that pins never starve requests
of memory; if a request still could not run, the pins give way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from localradix.mem.radix_cache import RadixCache
from localradix.sched.queues import RequestQueues
from localradix.sched.request import Req

logger = logging.getLogger("localradix.scheduler")

PIN_SHARE = 2  # pinned tokens stay within 1 / PIN_SHARE of the KV pool


@dataclass(eq=False)
class PinKeeper:
    cache: RadixCache
    queues: RequestQueues
    cached_budget: int | None = None  # --max-cached-tokens (or the runner's idle budget)
    clock: Callable[[], float] = time.monotonic  # deadlines are on this clock
    _warned: bool = field(default=False, init=False)

    @property
    def budget(self) -> int:
        """Most tokens pins may hold: half the pool, and no more than the cached-token budget
        (on llama.cpp every kept cell costs attention time in every step)."""
        half = self.cache.pool.total // PIN_SHARE
        return half if self.cached_budget is None else min(half, self.cached_budget)

    def apply(self, batch: list[Req]) -> None:
        """Pin the prefixes of the requests in `batch` whose whole prompt is now cached (once)."""
        for req in batch:
            if req.pinning.due and req.hold.kv_len >= len(req.ask.prompt_ids):
                self._pin(req)
                req.pinning.due = ()

    def _pin(self, req: Req) -> None:
        now, page = self.clock(), self.cache.page_size
        for pin in req.pinning.due:
            want = min(pin.tokens, len(req.ask.prompt_ids))
            key = req.ask.prompt_ids[:want]
            got = self.cache.pin(key, now + pin.ttl_s, req.ask.extra_key, self.budget)
            if got < want // page * page and not self.cache.disable and not self._warned:
                self._warned = True
                logger.warning(
                    "cache_control: a pin of %d tokens was clipped to %d: pins may hold at "
                    "most %d tokens (half the KV pool, within --max-cached-tokens); this is "
                    "logged once",
                    want,
                    got,
                    self.budget,
                )

    def sweep(self) -> None:
        """Drop the pins whose deadline has passed."""
        if self.cache.pins:
            self.cache.unpin_expired(self.clock())

    def unstick(self) -> bool:
        """Drop every pin when a waiting request cannot start with nothing else running (it
        needs more than pins leave free); True if there were pins to drop."""
        q = self.queues
        stuck = q.waiting and not q.running and q.chunked is None
        if not stuck or not self.cache.pins:
            return False
        logger.warning(
            "cache_control: dropping %d pins: a waiting request needs the room they hold",
            len(self.cache.pins),
        )
        self.cache.unpin_all()
        return True
