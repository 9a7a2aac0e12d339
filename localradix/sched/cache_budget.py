"""The cached-token budget (--max-cached-tokens) and cold prefixes.

A request that found less than half its prompt cached is likely a one-off: its prefix is
cached "cold", and cold prefixes beyond an eighth of the budget go first (a chat's history,
reused turn after turn, stays; a stream of unrelated prompts does not pile up).
"""

from __future__ import annotations

from localradix.mem.radix_cache import RadixCache
from localradix.sched.request import Req

COLD_HIT_RATIO = 2
COLD_SHARE = 8


def is_one_off(req: Req) -> bool:
    """Less than half the prompt was cached: its prefix is cached cold."""
    return req.cached_tokens * COLD_HIT_RATIO < len(req.prompt_ids)


def trim_cache(cache: RadixCache, budget: int | None) -> None:
    """Evict least recently used cached prefixes beyond `budget`: first the cold ones beyond
    an eighth of it, then any beyond it. The scheduler calls it only in a step that runs
    something, after admission and before the launch: the new tokens' KV can then take the
    freed room (llama.cpp's cells), and an idle engine keeps the last conversation whole for
    its next turn."""
    if budget is None:
        return
    cold = cache.evictable_cold_size
    if cold > budget // COLD_SHARE:
        cache.evict(cold - budget // COLD_SHARE, cold_only=True)
    cached = cache.evictable_size
    if cached > budget:
        cache.evict(cached - budget)
