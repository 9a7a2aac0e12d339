"""SWA twins: every sequence of a sliding-window model has a twin holding the same cells.

llama.cpp reuses a cell whose only sequence has moved a window past it (`find_slot`: a cell
of one sequence, masked by that sequence's sliding window, counts as free), with `swa_full`
too. The radix tree still owns such a cell: a later request that shares a shorter prefix
attends over it inside its own window. A cell tagged by two sequences is never taken that
way, so each sequence `s` gets a twin `s + offset` that every token and every tag change
also names, and no cell is ever held by one sequence alone. The cache tiers' spare sequence
(past the twins) has none: it holds cells only between two calls, while nothing decodes.
"""

from __future__ import annotations

from localradix.backends.llamacpp.seq_map import SeqMemory


class TwinnedMemory:
    """The SeqMemory `SeqMap` sees: each call applied to the sequence and to its twin (the
    sequences below `offset` have one)."""

    def __init__(self, memory: SeqMemory, offset: int) -> None:
        self.memory = memory
        self.offset = offset

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.memory.seq_rm(seq, p0, p1)
        if seq < self.offset:
            self.memory.seq_rm(seq + self.offset, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.memory.seq_cp(src, dst, p0, p1)
        if dst < self.offset:
            self.memory.seq_cp(src, dst + self.offset, p0, p1)
