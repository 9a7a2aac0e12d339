"""StateIndex: which model states the host tier holds after each chunk, for `KVTiers.fetch_state`.

A state is named by its chunk (`parent`) and the tokens past it (`state_digest`), so a prompt's
states are found per chunk: the index lists, per parent, each state's digest and tail length,
and a lookup computes a digest only for the tail lengths listed (the disk tier keeps the same
list in a file beside its chunks: `DiskTier.states`). Entries outlive their state (the host tier
drops chunks on its own): a stale entry is a miss, and entries are pruned whenever the index
has doubled since the last sweep, so it stays proportional to what the tier holds.
"""

from __future__ import annotations

from collections.abc import Callable

MIN_SWEEP = 64  # entries before the first sweep


class StateIndex:
    def __init__(self, holds: Callable[[bytes], bool]) -> None:
        self.holds = holds  # whether the tier still holds a digest
        self._after: dict[bytes, dict[bytes, int]] = {}  # parent -> {digest: tail length}
        self._count = 0
        self._sweep_at = MIN_SWEEP

    def add(self, parent: bytes, digest: bytes, tail: int) -> None:
        listed = self._after.setdefault(parent, {})
        if digest not in listed:
            listed[digest] = tail
            self._count += 1
        if self._count >= self._sweep_at:
            self._sweep()

    def get(self, parent: bytes) -> list[tuple[bytes, int]]:
        """(digest, tail length) of the states listed after `parent` (some maybe gone)."""
        return list(self._after.get(parent, {}).items())

    def __len__(self) -> int:
        return self._count

    def _sweep(self) -> None:
        for parent in list(self._after):
            kept = {d: n for d, n in self._after[parent].items() if self.holds(d)}
            if kept:
                self._after[parent] = kept
            else:
                del self._after[parent]
        self._count = sum(len(listed) for listed in self._after.values())
        self._sweep_at = max(MIN_SWEEP, 2 * self._count)
