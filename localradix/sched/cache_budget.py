"""The cached-token budget (--max-cached-tokens) and cold prefixes.

A request that found less than half its prompt cached is likely a one-off: its prefix turns
"cold" COLD_GRACE_S after it is cached unless a request hits it first, and cold prefixes beyond
an eighth of the budget go first (a stream of unrelated prompts does not pile up). The grace
is for conversations: a chat's first turn looks like a one-off, and its next turn arrives a
client round trip later; evicting the history before that made every later turn a miss again
(the bench's chat workload: 62% of its prompts cached instead of 84%).
"""

from __future__ import annotations

import math

from localradix.mem.radix_cache import RadixCache
from localradix.sched.request import Req

COLD_HIT_RATIO = 2
COLD_SHARE = 8
# Seconds a one-off prompt's prefix stays warm: a client's next turn (or tool result) comes
# sooner, and on the backends that set a budget an idle cell costs far less than re-prefilling.
COLD_GRACE_S = 2.0


def is_one_off(req: Req) -> bool:
    """Less than half the prompt was cached: its prefix is cached cold."""
    return req.hold.cached_tokens * COLD_HIT_RATIO < len(req.ask.prompt_ids)


def cold_from(req: Req, now: float) -> float:
    """When the prefix `req` caches turns cold (`TreeNode.cold_from`); inf: it stays warm."""
    return now + COLD_GRACE_S if is_one_off(req) else math.inf


def trim_cache(cache: RadixCache, budget: int | None, now: float) -> None:
    """Evict least recently used cached prefixes beyond `budget`: first the cold ones beyond
    an eighth of it, then any beyond it. The scheduler calls it only in a step that runs
    something, after admission and before the launch: the new tokens' KV can then take the
    freed room (llama.cpp's cells), and an idle engine keeps the last conversation whole for
    its next turn."""
    if budget is None:
        return
    cold = cache.evictable_cold_size(now)
    if cold > budget // COLD_SHARE:
        cache.evict(cold - budget // COLD_SHARE, cold_at=now)
    cached = cache.evictable_size
    if cached > budget:
        cache.evict(cached - budget)
