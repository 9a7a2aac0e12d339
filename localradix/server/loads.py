"""The load report smg (the multi-replica gateway) polls at `GET /v1/loads`, from the engine's
latest stats snapshot: SGLang's schema, one data-parallel rank."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localradix.server.state import ServerState


def load_report(server: ServerState) -> dict[str, Any]:
    stats = server.client.stats
    running = stats.running if stats else 0
    queued = stats.queued if stats else 0
    kv_total = stats.kv_total if stats else server.client.loaded.kv_total_tokens
    kv_used = stats.kv_used if stats else 0
    hits = stats.cache_hit_tokens if stats else 0
    looked_up = hits + (stats.cache_miss_tokens if stats else 0)
    max_running = server.args.max_running_requests
    rank = {
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": queued,
        "num_waiting_uncached_tokens": _waiting_uncached(stats),
        "num_total_reqs": running + queued,
        "num_used_tokens": kv_used,
        "max_total_num_tokens": kv_total,
        "token_usage": kv_used / kv_total if kv_total else 0.0,
        "gen_throughput": stats.decode_tokens_per_s if stats else 0.0,
        "cache_hit_rate": hits / looked_up if looked_up else 0.0,
        "utilization": running / max_running if max_running else 0.0,
        "max_running_requests": max_running,
    }
    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    return {"timestamp": now, "dp_rank_count": 1, "loads": [rank]}


def _waiting_uncached(stats: Any) -> int:
    """Prompt tokens of waiting requests not yet cached (the stats list the first 32)."""
    if stats is None:
        return 0
    total = 0
    for row in stats.requests:
        if row.get("state") == "waiting":
            total += max(0, int(row.get("prompt_tokens", 0)) - int(row.get("cached_tokens", 0)))
    return total
