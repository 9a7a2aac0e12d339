"""Request limits in one place: which prompts the engine can take and how many tokens a request
may ask for, with one wording for every front end (server, in-process Engine).

The scheduler keeps its own last-line checks; a prompt that passes here passes there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localradix.messages import ModelInfo


@dataclass(frozen=True)
class PromptProblem:
    """Why a prompt cannot run; `code` is the OpenAI error code, when there is one."""

    message: str
    code: str | None = None


@dataclass(frozen=True)
class RequestLimits:
    context_length: int
    kv_total_tokens: int = 0  # 0: unknown (not checked)
    vocab_size: int = 0  # 0: unknown (not checked)

    @classmethod
    def of(cls, info: ModelInfo) -> RequestLimits:
        return cls(info.context_length, info.kv_total_tokens or 0, info.vocab_size or 0)

    def prompt_problem(self, ids: Sequence[int]) -> PromptProblem | None:
        """The first reason the engine could not take this prompt, or None. Both lengths are in
        the message: a prompt is never silently truncated."""
        n = len(ids)
        if n == 0:
            return PromptProblem("the prompt is empty")
        if n >= self.context_length:
            return PromptProblem(
                f"the prompt is {n} tokens long but the model's context length is "
                f"{self.context_length} tokens (the prompt must be shorter to leave room for "
                "output)",
                "context_length_exceeded",
            )
        if self.kv_total_tokens and n + 1 > self.kv_total_tokens:
            return PromptProblem(
                f"the prompt is {n} tokens long but the KV cache holds {self.kv_total_tokens} "
                "tokens; the server needs a larger --max-total-tokens",
                "context_length_exceeded",
            )
        if self.vocab_size and (min(ids) < 0 or max(ids) >= self.vocab_size):
            return PromptProblem(f"token ids must be in [0, {self.vocab_size})")
        return None

    def max_new_tokens(self, requested: int | None) -> int:
        """The request's output budget: past the context nothing more can be generated, so a
        huge (or missing) value becomes the context length. The scheduler later clamps it to
        the room left after each prompt."""
        return self.context_length if requested is None else min(requested, self.context_length)
