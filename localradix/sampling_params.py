"""Per-request generation parameters, shared by the Engine API, the server and the runner."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class InvalidParams(ValueError):
    """A parameter is out of range; `param` names it so the API can say which."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


CONSTRAINT_KINDS = ("json_object", "json_schema", "regex", "ebnf", "structural_tag")


@dataclass(frozen=True)
class Constraint:
    """Grammar-constrained decoding: every generated token keeps the output inside `spec`.

    kind: json_object (any JSON object; spec unused), json_schema (spec = the schema as JSON
    text), regex, ebnf (GBNF-style grammar with a `root` rule), structural_tag (xgrammar's JSON).
    """

    kind: str
    spec: str = ""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = no top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None  # None = off; k >= 0 = chosen token plus top-k alternatives
    skip_special_tokens: bool = True
    # Special tokens shown even with skip_special_tokens: the markers of the output parsers
    # (harmony's <|channel|>, DeepSeek's call tokens, ...), which must reach them as text.
    kept_special_ids: tuple[int, ...] = ()
    constraint: Constraint | None = None
    speculative: bool = True  # False: never speculate for this request (--speculative is on)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)

    def validate(self) -> SamplingParams:
        """Raise InvalidParams for the first out-of-range field; return self otherwise."""
        checks = (
            (self.max_new_tokens >= 0, "max_tokens", "must be >= 0"),
            (0.0 <= self.temperature <= 100.0, "temperature", "must be in [0, 100]"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 1, "top_k", "must be -1 or >= 1"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (0.0 < self.repetition_penalty <= 10.0, "repetition_penalty", "must be in (0, 10]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (1 <= self.n <= 64, "n", "must be in [1, 64]"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "must be in [0, 20]"),
            (len(self.stop) <= 16, "stop", "at most 16 stop strings"),
            (all(self.stop), "stop", "stop strings must not be empty"),
            (
                self.constraint is None or self.constraint.kind in CONSTRAINT_KINDS,
                "response_format",
                f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}",
            ),
        )
        for ok, param, why in checks:
            if not ok:
                raise InvalidParams(f"'{param}' {why}", param)
        return self
