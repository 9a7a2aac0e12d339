"""Ollama's request bodies (unknown keys ignored, types strict)."""

from __future__ import annotations

from typing import Any

from msgspec import Struct


class Options(Struct, kw_only=True):
    num_ctx: int | None = None
    num_predict: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Not Ollama's: its API cannot force a call. "auto", "none", "required", a function's
    # name, or OpenAI's {"type": "function", "function": {"name": ...}}.
    tool_choice: str | dict[str, Any] | None = None


class ToolFunction(Struct):
    name: str
    arguments: dict[str, Any] | str = {}


class ToolCallIn(Struct):
    function: ToolFunction
    id: str | None = None


class Message(Struct, kw_only=True):
    role: str
    content: str = ""
    images: list[Any] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None
    thinking: str | None = None


class _Request(Struct, kw_only=True):
    model: str = ""
    stream: bool = True
    format: str | dict[str, Any] | None = None
    options: Options | None = None
    keep_alive: float | str | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    images: list[Any] | None = None


class ChatBody(_Request, kw_only=True):
    messages: list[Message] = []
    tools: list[dict[str, Any]] | None = None


class GenerateBody(_Request, kw_only=True):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False


class ModelBody(Struct, kw_only=True):
    model: str = ""
    name: str = ""  # the older spelling
