"""N-gram (prompt-lookup) drafting: propose the tokens that followed the longest recent match of
a request's last tokens, first in its own context (prompt + output so far), else in the other
sequences the radix cache holds (`spec.tree_source`).

No draft model: a code edit or a quoting answer repeats long runs of its prompt, and those runs
are free drafts. Drafts only change speed, never output: the verifier (`spec.verify`) keeps
exactly the tokens the target model would have produced.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from localradix.spec.grams import gram_hashes
from localradix.spec.tree_source import ContinuationSource

__all__ = ["ContextIndex", "Draft", "NgramConfig", "NgramDrafter"]

_NO_TOKENS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class NgramConfig:
    """How drafts are matched (`--speculative-min-match` sets `min_match`)."""

    min_match: int = 3  # shortest suffix of the context worth matching (the anchor)
    max_match: int = 8  # longest suffix compared: among matches, the longest agreement wins
    max_candidates: int = 64  # most recent occurrences of the anchor compared per draft
    # An extend at least this long (a prompt) is indexed with numpy in one go, not per token.
    bulk_min: int = 256

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {self}")
        if self.max_candidates < 1 or self.bulk_min < 1:
            raise ValueError(f"need max_candidates >= 1 and bulk_min >= 1, got {self}")


@dataclass(frozen=True)
class Draft:
    """Up to k proposed next tokens, the suffix length they were matched on, and their source."""

    tokens: np.ndarray  # int64 [<= k]; empty when nothing matched
    match_len: int = 0
    source: str = "none"  # "context" | "tree" | "none"

    def __len__(self) -> int:
        return len(self.tokens)


class ContextIndex:
    """A request's tokens and, for every `min_match`-gram, where its occurrences end.

    A gram is registered once the token after it exists, so every indexed occurrence has a
    continuation and the current suffix never matches itself. Tokens appended one by one cost
    O(1) each (a dict append); a long extend (the prompt) is indexed at once as sorted numpy
    gram hashes, searched by bisection. `match` compares the newest `max_candidates`
    occurrences of the anchor (the last `min_match` tokens) backwards, up to `max_match`
    tokens, and keeps the longest agreement; ties go to the most recent occurrence.
    """

    def __init__(self, config: NgramConfig) -> None:
        self.config = config
        self._tokens = array("q")
        self._ends: dict[tuple[int, ...], array] = {}  # grams registered one by one
        self._bulk_hashes = np.zeros(0, dtype=np.uint64)  # sorted; grams of a bulk extend
        self._bulk_ends = np.zeros(0, dtype=np.int64)  # ascending within one hash

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> np.ndarray:
        """The indexed tokens (int64, a copy)."""
        return np.array(self._tokens, dtype=np.int64)

    def suffix(self, n: int) -> np.ndarray:
        """The last `n` tokens (fewer if the context is shorter)."""
        return np.array(self._tokens[max(len(self._tokens) - n, 0) :], dtype=np.int64)

    def extend(self, tokens: Iterable[int]) -> None:
        new = np.fromiter(tokens, dtype=np.int64)
        if len(new) >= self.config.bulk_min:
            self._tokens.frombytes(new.tobytes())
            self._index_all()
            return
        n, toks = self.config.min_match, self._tokens
        for token in new.tolist():
            toks.append(token)
            end = len(toks) - 2  # the gram ending here now has a continuation
            if end >= n - 1:
                gram = tuple(toks[end - n + 1 : end + 1])
                self._ends.setdefault(gram, array("q")).append(end)

    def match(self) -> tuple[int, int] | None:
        """(end of the best earlier occurrence of the context's suffix, agreement length)."""
        n, toks, cfg = self.config.min_match, self._tokens, self.config
        if len(toks) < n + 1:
            return None
        best_end, best_len = -1, 0
        last = len(toks) - 1
        for end in itertools.islice(self._candidates(), cfg.max_candidates):
            agree = self._agreement(end, last)
            if agree > best_len:
                best_end, best_len = end, agree
                if agree == cfg.max_match:
                    break
        return (best_end, best_len) if best_len >= n else None

    def continuation(self, end: int, k: int) -> np.ndarray:
        return np.array(self._tokens[end + 1 : end + 1 + k], dtype=np.int64)

    def _candidates(self) -> Iterator[int]:
        """Ends of earlier occurrences of the anchor, newest first (bulk ones may collide)."""
        n, toks = self.config.min_match, self._tokens
        anchor = toks[len(toks) - n :]
        yield from reversed(self._ends.get(tuple(anchor), ()))
        if len(self._bulk_hashes):
            h = gram_hashes(np.frombuffer(anchor, dtype=np.int64), n)[0]
            lo = np.searchsorted(self._bulk_hashes, h)
            hi = np.searchsorted(self._bulk_hashes, h, "right")
            yield from reversed(self._bulk_ends[lo:hi].tolist())

    def _agreement(self, end: int, last: int) -> int:
        """How many tokens ending at `end` equal those ending at `last` (capped at max_match)."""
        toks, n = self._tokens, 0
        limit = min(self.config.max_match, end + 1)
        while n < limit and toks[end - n] == toks[last - n]:
            n += 1
        return n

    def _index_all(self) -> None:
        """Index every gram with a continuation as sorted hashes; the dict starts over."""
        n = self.config.min_match
        done = np.frombuffer(self._tokens, dtype=np.int64)[:-1]
        hashes = gram_hashes(done, n)
        order = np.argsort(hashes, kind="stable")  # equal hashes stay in position order
        self._bulk_hashes, self._bulk_ends = hashes[order], order + n - 1
        self._ends.clear()


class NgramDrafter:
    """One request's drafter: its own context first, then the radix cache's sequences.

    The scheduler creates it with the prompt, calls `append` with every token it *accepts*
    (never rejected drafts), and `propose(k)` before each verify step.
    """

    def __init__(
        self,
        config: NgramConfig,
        prompt_ids: Iterable[int],
        tree: ContinuationSource | None = None,
        extra_key: str | None = None,
    ) -> None:
        self.config = config
        self.context = ContextIndex(config)
        self.context.extend(prompt_ids)
        self.tree = tree
        self.extra_key = extra_key

    def append(self, tokens: Iterable[int]) -> None:
        self.context.extend(tokens)

    def propose(self, k: int) -> Draft:
        if k <= 0:
            return Draft(_NO_TOKENS)
        found = self.context.match()
        if found is not None:
            end, agree = found
            return Draft(self.context.continuation(end, k), agree, "context")
        return self._from_tree(k)

    def _from_tree(self, k: int) -> Draft:
        if self.tree is None or len(self.context) < self.config.min_match:
            return Draft(_NO_TOKENS)
        suffix = self.context.suffix(self.config.max_match)
        found = self.tree.continuation(suffix, k, self.extra_key)
        if found is None:
            return Draft(_NO_TOKENS)
        return Draft(found.tokens[:k], found.match_len, "tree")
