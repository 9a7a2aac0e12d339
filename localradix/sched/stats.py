"""The scheduler's counters, throughput meters, logs and the TUI's previews.

Previews (prompt text of cached prefixes and of cache misses) need the tokenizer's `decode`;
it is handed in, and a preview that fails is left empty rather than failing a step.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from localradix.mem.radix_cache import MatchResult
from localradix.mem.snapshot_store import SnapshotStore
from localradix.messages import EngineStats
from localradix.sched.prefill_pace import PrefillPace
from localradix.sched.queues import RequestQueues
from localradix.sched.request import Req
from localradix.sched.slot_handoff import SlotHandoff
from localradix.sched.stop_check import Decode
from localradix.sched.throughput import ThroughputMeter
from localradix.spec import SpecCounters

logger = logging.getLogger("localradix.scheduler")

PREFIXES_REFRESH_S = 1.0  # the stats' prefix ranking walks the whole tree: at most once a second


@dataclass
class CacheHits:
    """Prompt tokens served from / missing in the cache, counted once per request (at its
    first admission: a retracted request's return is not a new hit)."""

    hit_tokens: int = 0
    miss_tokens: int = 0

    def record(self, hit_tokens: int, miss_tokens: int) -> None:
        self.hit_tokens += hit_tokens
        self.miss_tokens += miss_tokens

    @property
    def rate(self) -> float:
        seen = self.hit_tokens + self.miss_tokens
        return self.hit_tokens / seen if seen else 0.0


class SchedulerStats:
    def __init__(
        self, queues: RequestQueues, slots: SlotHandoff, decode: Decode, log_interval: int
    ) -> None:
        self.queues = queues
        self.slots = slots
        self.decode = decode
        self.log_interval = max(log_interval, 1)  # decode steps between two log lines
        self.retractions = 0
        self.hits = CacheHits()
        self.prompt_tokens_total = 0
        self.generated_tokens_total = 0
        self.prefill_meter = ThroughputMeter()
        self.decode_meter = ThroughputMeter()
        self.decode_steps = 0
        self.spec = SpecCounters()  # verify steps (request-steps with drafts), summed
        self.last_read = 0.0  # when the host last read a step's tokens (step timing)
        self.pace: PrefillPace | None = None  # sizes prefill steps from their measured time
        self.recent_misses: deque[dict] = deque(maxlen=16)
        self._prefixes: tuple[dict, ...] = ()
        self._prefixes_at = -PREFIXES_REFRESH_S

    def time_step(self, is_prefill: bool, num_tokens: int, started: float) -> None:
        """A step's tokens were read: time it from its launch or the previous read, whichever
        came later (with overlap the two steps ran back to back)."""
        now = time.monotonic()
        meter = self.prefill_meter if is_prefill else self.decode_meter
        busy = now - max(started, self.last_read)
        meter.add(num_tokens, busy)
        if is_prefill and self.pace is not None:
            self.pace.record(num_tokens, busy)
        self.last_read = now

    def count_decode_step(self) -> None:
        """A decode step's tokens were applied; log every `log_interval` of them."""
        self.decode_steps += 1
        if self.decode_steps % self.log_interval == 0:
            self.log_decode()

    def note_miss(self, req: Req, match: MatchResult) -> None:
        """Remember where a new prompt left the cached path (the TUI explains misses)."""
        div = match.divergence
        if div is None or match.matched_len >= len(req.ask.prompt_ids) - 1:
            return
        at = int(div.position)
        ids = req.ask.prompt_ids
        self.recent_misses.append(
            {
                "rid": req.ask.rid,
                "prompt_tokens": len(ids),
                "matched_tokens": match.matched_len,
                "reason": div.reason,
                "position": at,
                "cached_text": "" if div.cached_token is None else self.preview([div.cached_token]),
                "request_text": self.preview(ids[at : at + 6].tolist()),
                "before_text": self.preview(ids[max(at - 6, 0) : at].tolist()),
            }
        )

    def preview(self, ids: list[int]) -> str:
        try:
            return self.decode([int(t) for t in ids if t is not None])[:80]
        except Exception:  # a preview is never worth failing a step
            return ""

    def kv_usage(self) -> float:
        cache = self.slots.cache
        return cache.protected_size / max(self.slots.pool.total, 1)

    def snapshot(self) -> EngineStats:
        now = time.monotonic()
        q, cache, pool = self.queues, self.slots.cache, self.slots.pool
        holders = q.holders()
        return EngineStats(
            running=len(q.running) + (q.chunked is not None),
            queued=len(q.waiting),
            kv_total=pool.total,
            kv_used=cache.protected_size + sum(len(self.slots.owned(r)) for r in holders),
            kv_cached=cache.evictable_size,
            kv_free=pool.available,
            cache_hit_tokens=self.hits.hit_tokens,
            cache_miss_tokens=self.hits.miss_tokens,
            prompt_tokens_total=self.prompt_tokens_total,
            generated_tokens_total=self.generated_tokens_total,
            retractions=self.retractions,
            spec_verify_steps=self.spec.steps,
            spec_draft_tokens=self.spec.drafted,
            spec_accepted_tokens=self.spec.accepted,
            prefill_tokens_per_s=self.prefill_meter.rate(now),
            decode_tokens_per_s=self.decode_meter.rate(now),
            requests=tuple(_req_row(r, now) for r in holders + q.waiting[:32]),
            top_prefixes=self._top_prefixes(now),
            recent_misses=tuple(self.recent_misses),
            kv_pinned=cache.pinned_size,
            **_snapshot_stats(cache.snapshots),
        )

    def _top_prefixes(self, now: float) -> tuple[dict, ...]:
        """The tree's best prefixes, recomputed at most once a second (it walks every node)."""
        if now - self._prefixes_at >= PREFIXES_REFRESH_S:
            rows = self.slots.cache.top_prefixes(8)
            for row in rows:
                row["preview"] = self.preview(row["head"])
            self._prefixes, self._prefixes_at = tuple(rows), now
        return self._prefixes

    def log_prefill(self, admitted: list[Req]) -> None:
        logger.info(
            "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, KV usage: %.2f, "
            "#running: %d, #queue: %d",
            len(admitted),
            sum(r.hold.extend_len for r in admitted),
            sum(r.hold.kv_len for r in admitted),
            self.kv_usage(),
            len(self.queues.running),
            len(self.queues.waiting),
        )

    def log_decode(self) -> None:
        spec = ""
        if self.spec.steps:
            rate, per_step = self.spec.acceptance_rate, self.spec.tokens_per_step
            spec = f", spec accept {rate:.2f}, tokens/step {per_step:.2f}"
        logger.info(
            "Decode batch. #running: %d, KV usage: %.2f, gen throughput (token/s): %.1f, "
            "#queue: %d%s",
            len(self.queues.running),
            self.kv_usage(),
            self.decode_meter.rate(time.monotonic()),
            len(self.queues.waiting),
            spec,
        )


def _req_row(req: Req, now: float) -> dict:
    ttft = (
        None
        if req.progress.first_token_time is None
        else req.progress.first_token_time - req.ask.arrival_time
    )
    return {
        "id": req.ask.rid,
        "state": req.hold.state.value,
        "prompt_tokens": len(req.ask.prompt_ids),
        "cached_tokens": max(req.hold.cached_tokens, 0),
        "generated_tokens": len(req.progress.output_ids),
        "ttft_s": ttft,
        "age_s": now - req.ask.arrival_time,
        "retractions": req.progress.retractions,
    }


def _snapshot_stats(store: SnapshotStore | None) -> dict[str, Any]:
    if store is None:
        return {}
    return {
        "snapshots": store.count,
        "snapshot_bytes": store.bytes,
        "snapshot_hits": store.hits,
        "snapshot_miss_tokens": store.unresumed,
    }
