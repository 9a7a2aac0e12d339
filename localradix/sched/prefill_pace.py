"""How many prompt tokens one prefill step may take, so that a step stays near a time budget.

A long prompt is prefilled in chunks. With a fixed chunk (2,048 tokens) a step on a CPU can
take a minute at the end of an 8k-token prompt, and every other request waits that long for
its turn. The pace measures the seconds per prefilled token of recent prefill steps (an
average that follows the prompt's growing attention cost) and sizes the next step to
`budget_s` of work, between a minimum (128 tokens: smaller chunks waste the matmuls, and the
measured speed then falls with them: 42-token chunks ran 3x slower a token on llama.cpp's CPU
kernels) and --chunked-prefill-size. On a GPU a 2,048-token chunk takes milliseconds: the cap decides there.
"""

from __future__ import annotations

FIRST_STEP_TOKENS = 256  # before anything is measured: a probe, not a minute-long step
MIN_STEP_TOKENS = 128  # the least a chunk takes: smaller ones waste the matmuls (see above)
MIN_MEASURED_TOKENS = 16  # steps smaller than this time overheads more than tokens
SMOOTHING = 0.5  # weight of the newest measurement


class PrefillPace:
    def __init__(
        self, budget_s: float, cap: int, page: int = 1, min_tokens: int = MIN_STEP_TOKENS
    ) -> None:
        self.budget_s = budget_s
        self.cap = cap  # --chunked-prefill-size (0: never chunk)
        self.page = max(page, 1)
        self.min_tokens = min_tokens
        self.seconds_per_token: float | None = None

    def step_tokens(self) -> int:
        """The prefill tokens for the next step (0: no limit, --chunked-prefill-size 0)."""
        if self.cap <= 0 or self.budget_s <= 0:
            return self.cap
        if self.seconds_per_token is None:
            return min(self.cap, FIRST_STEP_TOKENS)
        tokens = int(self.budget_s / self.seconds_per_token)
        tokens = min(self.cap, max(self.min_tokens, tokens))
        return max(self.page, tokens // self.page * self.page)

    def record(self, tokens: int, seconds: float) -> None:
        """A prefill step of `tokens` took `seconds` (launch to tokens read)."""
        if tokens < MIN_MEASURED_TOKENS or seconds <= 0:
            return
        measured = seconds / tokens
        old = self.seconds_per_token
        self.seconds_per_token = measured if old is None else old + SMOOTHING * (measured - old)
