"""The neutral chat request: what every dialect's adapter builds once from its own body, and
all the chat core (`chat_job`, `tool_setup`, `sampling_params`) reads.

Each adapter validates its values against the neutral types with `checked`, naming its own
parameter, and gives `ParamNames` for what the core checks later (the prompt's length, the
output constraint, max_tokens), so every error names the field the client sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from localradix.sampling_params import Constraint
from localradix.server.errors import from_decode_error

T = TypeVar("T")


@dataclass(frozen=True)
class ParamNames:
    """Neutral field -> the dialect's own name for it (a field not listed keeps its name)."""

    names: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, neutral: str) -> str:
        return self.names.get(neutral, neutral)


OPENAI_NAMES = ParamNames()


@dataclass(frozen=True)
class Sampling:
    """The sampling knobs of a request (None: the engine's default)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    speculative: bool = True


@dataclass(frozen=True)
class ChatRequest:
    """One chat turn to generate, in no dialect's words.

    `messages` and `tools` are as chat templates read them (OpenAI's message shape, tool
    arguments as objects); `template_kwargs` already holds the reasoning switches; `logprobs`
    is the number of alternatives per token when logprobs are asked for (None: not asked);
    `constraint_param` names the dialect's field the constraint came from."""

    model: str | None
    messages: list[dict[str, Any]]
    sampling: Sampling = Sampling()
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_effort: str | None = None
    add_generation_prompt: bool = True
    max_tokens: int | None = None
    logprobs: int | None = None
    constraint: Constraint | None = None
    constraint_param: str | None = None
    stream: bool = False
    names: ParamNames = OPENAI_NAMES

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools or () if _is_function(t))

    @property
    def tool_schemas(self) -> dict[str, Any]:
        """Each function's parameters schema, by name (XML-style calls type their values)."""
        return {
            t["function"]["name"]: t["function"].get("parameters")
            for t in self.tools or ()
            if _is_function(t)
        }


def _is_function(tool: dict[str, Any]) -> bool:
    return isinstance(tool.get("function"), dict)


def checked(value: Any, type_: Any, param: str) -> Any:
    """`value` as a `type_` (strictly, as a JSON body's field is decoded), or a 400 naming
    `param` (and the place inside it: `stop[0]`, `tools[1].function.name`)."""
    try:
        return msgspec.convert(value, type_, strict=True)
    except msgspec.ValidationError as exc:
        raise from_decode_error(exc, param) from None
