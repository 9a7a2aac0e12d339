"""Per-request draft length: grow while drafts are accepted, shrink on rejection, and stop
speculating for a request whose drafts keep failing (each rejected draft token cost a forward
position and a KV slot for nothing). Plus the counters `/metrics`, the log and the TUI show.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["AdaptiveConfig", "AdaptiveK", "SpecCounters"]


@dataclass(frozen=True)
class AdaptiveConfig:
    k_max: int = 8  # --speculative-k: the most drafts verified in one step
    k_start: int = 4
    window: int = 8  # verify steps (with a draft) that judge a request's acceptance
    min_acceptance: float = 0.2  # below this over a full window: speculation off for it

    def __post_init__(self) -> None:
        if not 1 <= self.k_start <= self.k_max:
            raise ValueError(f"need 1 <= k_start <= k_max, got {self}")
        if self.window < 1 or not 0.0 <= self.min_acceptance <= 1.0:
            raise ValueError(f"need window >= 1 and 0 <= min_acceptance <= 1, got {self}")


@dataclass
class SpecCounters:
    """Totals over verify steps that carried a draft (for a request, or summed for the engine).

    `emitted` counts accepted drafts plus the correction/bonus token of each step, so
    `tokens_per_step` is the speed-up over plain decode before the cost of verifying.
    """

    steps: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted {accepted} of {drafted} drafts")
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted

    def merge(self, other: SpecCounters) -> None:
        self.steps += other.steps
        self.drafted += other.drafted
        self.accepted += other.accepted

    @property
    def emitted(self) -> int:
        return self.accepted + self.steps

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0


@dataclass
class AdaptiveK:
    """One request's acceptance record (`alpha`, from verified and shadow drafts), whether it
    still speculates, and a heuristic draft length k in [1, k_max]. The scheduler drafts the
    k that `spec.best_draft_len` picks from `alpha` and the runner's verify cost; `k` is the
    rule for a caller with no cost to weigh.

    Full acceptance doubles k (runs of copied text are long); a rejection after `a` accepted
    drafts sets k to `a + 1` (never above the current k), the length that would have been
    fully accepted plus one to probe further. Steps with no draft are not recorded: they cost
    nothing and say nothing about the drafts' quality.
    """

    config: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    k: int = 0
    enabled: bool = True
    counters: SpecCounters = field(default_factory=SpecCounters)
    _recent: deque[tuple[int, int]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.k == 0:
            self.k = self.config.k_start

    @property
    def draft_len(self) -> int:
        """How many drafts to propose now (0 once speculation is off for this request)."""
        return self.k if self.enabled else 0

    def record(self, drafted: int, accepted: int) -> None:
        """The outcome of a verify step that carried `drafted` drafts."""
        if drafted == 0:
            return
        self.counters.add(drafted, accepted)
        if accepted == drafted:
            self.k = min(self.config.k_max, 2 * self.k)
        else:
            self.k = max(1, min(self.k, accepted + 1))
        self.score(drafted, accepted)
        # Only verified drafts switch a request off: shadow ones cost nothing to be wrong.
        if (
            len(self._recent) == self.config.window
            and self.window_rate < self.config.min_acceptance
        ):
            self.enabled = False

    def score(self, drafted: int, accepted: int) -> None:
        """Judge drafts by how many the model agreed with: verified ones (`record`), or ones
        proposed but not run because they would not have paid, compared with the tokens
        that came next (free evidence: without it such a request could never show that its
        drafts have become good)."""
        if drafted == 0:
            return
        self._recent.append((drafted, accepted))
        if len(self._recent) > self.config.window:
            self._recent.popleft()

    @property
    def alpha(self) -> float:
        """The chance that a draft is accepted given the ones before it were, over the window:
        the geometric estimate accepted / (accepted + rejections), from one accepted and one
        rejected draft before any step (a step that kept all its drafts saw no rejection)."""
        accepted = sum(a for _, a in self._recent)
        rejections = sum(a < d for d, a in self._recent)
        return (accepted + 1) / (accepted + rejections + 2)

    @property
    def window_rate(self) -> float:
        """Acceptance rate over the last `window` steps with a draft."""
        drafted = sum(d for d, _ in self._recent)
        return sum(a for _, a in self._recent) / drafted if drafted else 0.0
