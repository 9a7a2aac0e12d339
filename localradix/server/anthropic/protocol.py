"""Anthropic Messages request bodies (unknown keys ignored, types strict)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct


class Block(Struct, kw_only=True):
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[Block] | None = None
    is_error: bool = False
    thinking: str | None = None  # thinking
    signature: str | None = None
    cache_control: dict[str, Any] | None = None


class Message(Struct):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(Struct, kw_only=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent; server tools (web_search_...) are refused
    cache_control: dict[str, Any] | None = None


class ToolChoice(Struct, kw_only=True):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool = False


class OutputFormat(Struct, kw_only=True):
    type: str
    schema: dict[str, Any]


class OutputConfig(Struct, kw_only=True):
    format: OutputFormat | None = None  # structured output: the grammar path


class CountTokensRequest(Struct, kw_only=True):
    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1)]
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
