"""What a text stream holds back: the tail that may still grow into a stop string or a marker."""

from __future__ import annotations

from collections.abc import Iterable


def held_suffix_len(text: str, candidates: Iterable[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `candidates`.

    A stream emits everything before it and waits for the next delta to decide.
    """
    longest = 0
    for s in candidates:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest
