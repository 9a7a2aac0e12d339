"""Backend-neutral KV memory: the slot pools, the radix prefix cache and its eviction policies.

Pure Python + numpy; nothing here imports torch or mlx.
"""

from localradix.mem.evict_policy import POLICIES, EvictionPolicy, get_policy
from localradix.mem.invariants import check_invariants
from localradix.mem.kv_pool import KVPool, ReqToTokenPool, SlotError
from localradix.mem.radix_cache import Divergence, MatchResult, RadixCache, TreeNode

__all__ = [
    "POLICIES",
    "Divergence",
    "EvictionPolicy",
    "KVPool",
    "MatchResult",
    "RadixCache",
    "ReqToTokenPool",
    "SlotError",
    "TreeNode",
    "check_invariants",
    "get_policy",
]
