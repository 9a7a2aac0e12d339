"""What the cache tiers hand back (`Fetched`: KV to load) and what they count (`TierCounters`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fetched:
    """KV for `key[start:end]`, to load into fresh slots."""

    start: int
    end: int
    parts: tuple[np.ndarray, ...]  # uint8 [tokens, bytes_per_token] each, in order
    from_disk: int  # of those tokens, how many came from disk (the rest: host memory)

    def cut(self, end: int) -> Fetched:
        """The first `end - start` tokens only (views)."""
        parts, left = [], end - self.start
        for part in self.parts:
            if left <= 0:
                break
            parts.append(part[:left])
            left -= len(parts[-1])
        return Fetched(self.start, end, tuple(parts), min(self.from_disk, end - self.start))


@dataclass
class TierCounters:
    demoted_tokens: int = 0  # copied down a tier when the tree evicted them
    promoted_tokens: int = 0  # loaded back into the tree for a request
    disk_hit_tokens: int = 0  # of those, from disk
    promotions: int = 0  # requests that loaded KV from a tier
    skipped_tokens: int = 0  # found in a tier, but prefilling them was measured cheaper
    load_seconds: float = 0.0  # reading and writing back promoted KV
    demoted_states: int = 0  # recurrent-state snapshots kept below the tree
    promoted_states: int = 0  # ... and loaded back for a request to resume from
