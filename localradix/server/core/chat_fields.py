"""A dialect's values as parts of the neutral chat request: each checked against the type the
OpenAI API gives it, and named in the dialect's own words when it is wrong."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from localradix.sampling_params import Constraint
from localradix.server.core.chat_request import ParamNames, Sampling, checked
from localradix.server.core.chat_template import template_messages
from localradix.server.core.sampling import response_constraint
from localradix.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    Count,
    ResponseFormat,
    Tool,
    ToolChoice,
)

MESSAGES = Annotated[list[ChatMessage], Meta(min_length=1)]
# The OpenAI type of each sampling field (its range and length limits included).
SAMPLING_TYPES = {
    f.name: f.type
    for f in msgspec.structs.fields(ChatCompletionRequest)
    if f.name in Sampling.__dataclass_fields__
}


def chat_messages(messages: list[dict[str, Any]], param: str) -> list[dict[str, Any]]:
    """Messages in OpenAI's shape (built by the dialect) as chat templates read them."""
    return template_messages(checked(messages, MESSAGES, param))


def chat_tools(tools: list[Any] | None, param: str = "tools") -> list[dict[str, Any]] | None:
    """Tools in OpenAI's shape, checked (a function needs a name)."""
    if not tools:
        return None
    builtins: list[dict[str, Any]] = msgspec.to_builtins(checked(tools, list[Tool], param))
    return builtins


def chat_tool_choice(choice: Any, param: str = "tool_choice") -> str | dict[str, Any] | None:
    """A tool_choice in OpenAI's shape: "none", "auto", "required" or a named function."""
    builtins: str | dict[str, Any] | None = msgspec.to_builtins(
        checked(choice, ToolChoice | None, param)
    )
    return builtins


def output_constraint(
    response_format: dict[str, Any] | None, param: str
) -> tuple[Constraint | None, str | None]:
    """The constraint an OpenAI-shaped response_format asks for, and the dialect's field."""
    constraint = response_constraint(checked(response_format, ResponseFormat | None, param))
    return constraint, (param if constraint is not None else None)


def max_tokens(value: int | None, names: ParamNames) -> int | None:
    checked_value: int | None = checked(value, Count | None, names("max_tokens"))
    return checked_value


def sampling(values: dict[str, Any], names: ParamNames) -> Sampling:
    """Sampling from the dialect's values, by neutral field name (None: the default)."""
    fields = {
        key: checked(value, SAMPLING_TYPES[key], names(key))
        for key, value in values.items()
        if value is not None
    }
    stop = fields.pop("stop", ())
    return Sampling(**fields, stop=(stop,) if isinstance(stop, str) else tuple(stop))
