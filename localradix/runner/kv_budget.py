"""How many tokens the KV pool reserves by default, and the one line that says why.

Every backend sizes its pool here, so `--max-total-tokens` and `--mem-fraction` mean the same on
all of them, and `localradix doctor` prints the same line the server logs. The default holds a
few full contexts (what a desktop server's handful of concurrent requests can use), never more
than `--mem-fraction` of the free memory. No torch here: doctor and the llamacpp runner use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from localradix.model_api.kv_layout import DTYPE_BYTES, KVLayout

if TYPE_CHECKING:
    from localradix.runner.runner_config import RunnerConfig

# Full contexts the default pool holds: room for a few concurrent long chats, or many short ones.
CONTEXTS_IN_POOL = 4
# The default pool holds at least this many tokens (models with short contexts), memory allowing.
MIN_DEFAULT_TOKENS = 16_384
# ... and never fewer than this, whatever the memory says.
MIN_KV_TOKENS = 1024
# Hybrid models' state snapshots (every backend): this share of the free memory by default ...
SNAPSHOT_MEMORY_SHARE = 0.25
MAX_DEFAULT_SNAPSHOT_BYTES = 8 * 2**30  # ... at most this ...
MIN_SNAPSHOT_BYTES = 64 * 2**20  # ... and at least this


def snapshot_budget(mib: float | None) -> int:
    """Bytes of state snapshots to keep: `--snapshot-mib`, else a share of the free memory."""
    if mib is not None:
        return round(mib * 2**20)
    import psutil

    free = int(psutil.virtual_memory().available * SNAPSHOT_MEMORY_SHARE)
    return max(MIN_SNAPSHOT_BYTES, min(free, MAX_DEFAULT_SNAPSHOT_BYTES))


def default_kv_dtype(requested: str, model_dtype: str) -> str:
    """The KV cache's dtype: bfloat16 for a float32 model under `--dtype auto` (half the memory,
    the precision llama.cpp's f16 cache also keeps); else the model's. An explicit
    `--dtype float32` keeps float32 K/V, for exact comparisons with float32 references."""
    return "bfloat16" if requested == "auto" and model_dtype == "float32" else model_dtype


def kv_tokens_from_memory(free_bytes: int, fraction: float, bytes_per_token: int) -> int:
    """KV slots that `fraction` of `free_bytes` holds (at least MIN_KV_TOKENS)."""
    return max(int(free_bytes * fraction) // bytes_per_token, MIN_KV_TOKENS)


# The budget's view of the cache is the layout every backend shares; the old name stays.
KVShape = KVLayout


@dataclass(frozen=True)
class KVBudget:
    tokens: int
    shape: KVLayout
    reason: str  # why this many, e.g. "4 x 8,192-token context"

    @property
    def bytes(self) -> int:
        return self.tokens * self.shape.bytes_per_token

    def describe(self) -> str:
        """E.g. "KV pool: 32,768 tokens x 30 layers x 3 KV heads x 64 dims x 2 (K, V) x 2 bytes
        (bfloat16) = 720 MiB (4 x 8,192-token context); set --max-total-tokens to change"."""
        s = self.shape
        return (
            f"KV pool: {self.tokens:,} tokens x {s.describe_layers()} x 2 (K, V) x "
            f"{DTYPE_BYTES[s.dtype]} bytes ({s.dtype}) = "
            f"{_mib(self.bytes)} ({self.reason}); set --max-total-tokens to change"
        )


def plan_kv_budget(
    args: RunnerConfig, shape: KVLayout, context_len: int, free_bytes: int
) -> KVBudget:
    """`--max-total-tokens` when given; else a few contexts within `--mem-fraction` of free."""
    if args.max_total_tokens:
        return KVBudget(args.max_total_tokens, shape, "--max-total-tokens")
    wanted = max(CONTEXTS_IN_POOL * context_len, MIN_DEFAULT_TOKENS)
    fits = kv_tokens_from_memory(free_bytes, args.mem_fraction, shape.bytes_per_token)
    if wanted <= fits:
        why = f"{CONTEXTS_IN_POOL} x {context_len:,}-token context"
        if wanted > CONTEXTS_IN_POOL * context_len:
            why = f"at least {MIN_DEFAULT_TOKENS:,} tokens; {why} needs fewer"
        return KVBudget(wanted, shape, why)
    why = (
        f"--mem-fraction {args.mem_fraction:g} of {free_bytes / 2**30:.1f} GiB free; "
        f"{CONTEXTS_IN_POOL} x {context_len:,}-token context would need "
        f"{_mib(wanted * shape.bytes_per_token)}"
    )
    if fits == MIN_KV_TOKENS:
        why += f"; {MIN_KV_TOKENS:,} tokens at least"
    return KVBudget(fits, shape, why)


def _mib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 10 * 2**30 else f"{n / 2**20:,.0f} MiB"
