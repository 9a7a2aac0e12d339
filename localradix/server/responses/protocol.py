"""Responses API request bodies (unknown keys ignored, types strict)."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

from localradix.server.protocol import ReasoningEffort


class Part(Struct, kw_only=True):
    """A content part: input_text / output_text / text (others are refused by name)."""

    type: str
    text: str | None = None


class InputItem(Struct, kw_only=True):
    """A message (role + content), a function_call, a function_call_output or a reasoning
    item; `type` may be left out for a message ("easy input message")."""

    type: str = "message"
    role: str | None = None  # message
    content: str | list[Part] | None = None
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call
    arguments: str | None = None
    output: str | list[Part] | None = None  # function_call_output


class FunctionTool(Struct, kw_only=True):
    """Responses' flat function tool; built-in tools (web_search, ...) are refused."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(Struct, kw_only=True):
    type: str
    name: str | None = None


class TextFormat(Struct, kw_only=True):
    type: str  # "text" | "json_object" | "json_schema"
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, kw_only=True):
    format: TextFormat | None = None


class ReasoningConfig(Struct, kw_only=True):
    effort: ReasoningEffort | None = None
    summary: str | None = None  # accepted; the reasoning is returned whole


class ResponsesRequest(Struct, kw_only=True):
    model: str | None = None
    input: Annotated[str, Meta(min_length=1)] | Annotated[list[InputItem], Meta(min_length=1)]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | FunctionChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
