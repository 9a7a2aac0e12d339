"""How many prompt tokens one prefill step may take, so that a step stays near a time budget.

A long prompt is prefilled in chunks. With a fixed chunk (2,048 tokens) a step on a CPU can
take a minute at the end of an 8k-token prompt, and every other request waits that long for
its turn. The pace measures the seconds per prefilled token of recent prefill steps (an
average that follows the prompt's growing attention cost) and sizes the next step to
`budget_s` of work, between a page-aligned minimum (the long prompt always progresses) and
--chunked-prefill-size. On a GPU a 2,048-token chunk takes milliseconds: the cap decides there.
"""

from __future__ import annotations

FIRST_STEP_TOKENS = 256  # before anything is measured: a probe, not a minute-long step
MIN_STEP_TOKENS = 32  # the least a chunk takes, so the long prompt always moves on
MIN_MEASURED_TOKENS = 16  # steps smaller than this time overheads more than tokens
SMOOTHING = 0.5  # weight of the newest measurement


class PrefillPace:
    def __init__(self, budget_s: float, cap: int, page: int = 1) -> None:
        self.budget_s = budget_s
        self.cap = cap  # --chunked-prefill-size (0: never chunk)
        self.page = max(page, 1)
        self.seconds_per_token: float | None = None

    def step_tokens(self) -> int:
        """The prefill tokens for the next step (0: no limit, --chunked-prefill-size 0)."""
        if self.cap <= 0 or self.budget_s <= 0:
            return self.cap
        if self.seconds_per_token is None:
            return min(self.cap, FIRST_STEP_TOKENS)
        tokens = int(self.budget_s / self.seconds_per_token)
        tokens = max(MIN_STEP_TOKENS, min(self.cap, tokens))
        return max(self.page, tokens // self.page * self.page)

    def record(self, tokens: int, seconds: float) -> None:
        """A prefill step of `tokens` took `seconds` (launch to tokens read)."""
        if tokens < MIN_MEASURED_TOKENS or seconds <= 0:
            return
        measured = seconds / tokens
        old = self.seconds_per_token
        self.seconds_per_token = measured if old is None else old + SMOOTHING * (measured - old)
