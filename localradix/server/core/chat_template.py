"""A chat request's prompt: its messages and tools through the model's chat template."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from localradix.loader.tool_prompt import involves_tools
from localradix.server.core.chat_request import ChatRequest
from localradix.server.errors import APIError, bad_request
from localradix.server.protocol import ChatMessage
from localradix.server.tokenizer_manager import TokenizerManager


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates read them: text parts joined, tool arguments as objects,
    reasoning also as `thinking`."""
    out = []
    for msg in messages:
        item = {f: v for f in msg.__struct_fields__ if (v := getattr(msg, f)) is not None}
        if isinstance(msg.content, list):
            item["content"] = "".join(part.text for part in msg.content)  # text parts only
        if msg.tool_calls:
            item["tool_calls"] = [_template_call(call) for call in msg.tool_calls]
            item.setdefault("content", "")  # templates read content even beside tool calls
        if msg.reasoning_content and not (msg.tool_calls and item["content"]):
            # gpt-oss's template reads reasoning as `thinking` (and refuses both beside calls)
            item.setdefault("thinking", msg.reasoning_content)
        out.append(item)
    return out


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's tool call as HF chat templates expect: OpenAI sends `arguments`
    as JSON text, templates write `arguments | tojson`, so a JSON object becomes a dict."""
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": arguments}}


# gpt-oss's template knows low, medium and high.
_TEMPLATE_EFFORT = {"none": "low", "minimal": "low", "xhigh": "high"}


def effort_kwargs(effort: str | None) -> dict[str, Any]:
    """Template variables for OpenAI's reasoning_effort (chat_template_kwargs win)."""
    if effort is None:
        return {}
    kwargs: dict[str, Any] = {"reasoning_effort": _TEMPLATE_EFFORT.get(effort, effort)}
    if effort == "none":
        kwargs["enable_thinking"] = False
    return kwargs


RESERVED_TEMPLATE_NAMES = frozenset({"messages", "tools", "add_generation_prompt"})


def template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """`chat_template_kwargs` as given; a name the server sets itself is a 400."""
    taken = RESERVED_TEMPLATE_NAMES & set(kwargs or {})
    if taken:
        message = f"chat_template_kwargs may not set {', '.join(sorted(taken))}"
        raise bad_request(message, "chat_template_kwargs")
    return dict(kwargs or {})


def template_vars(kwargs: dict[str, Any] | None, effort: str | None) -> dict[str, Any]:
    """The template's extra variables: the reasoning effort's, then chat_template_kwargs."""
    return {**effort_kwargs(effort), **template_kwargs(kwargs)}


def template_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools as templates expect them: OpenAI lets a function omit its description, but some
    templates (gpt-oss's) concatenate it, and Jinja cannot add text to an undefined value."""
    out = []
    for tool in tools:
        function = tool.get("function")
        if isinstance(function, dict) and function.get("description") is None:
            tool = {**tool, "function": {**function, "description": ""}}
        out.append(tool)
    return out


def chat_text(manager: TokenizerManager, chat: ChatRequest) -> str:
    """The request's messages through the model's chat template. Where the server writes the
    tools (the generic dialect), the template gets them and the tool history as text. With
    tool_choice "none" the tools stay in the prompt, as templates that write tools keep them:
    a turn that only switches tool_choice keeps its cached prefix (its output is not parsed
    for calls)."""
    try:
        tools = template_tools(chat.tools) if chat.tools else None
        messages = chat.messages
        if involves_tools(messages, tools) and manager.injects_tools:
            messages, tools = manager.tool_prompt.messages(messages, tools), None
        return str(
            manager.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=chat.add_generation_prompt,
                **chat.template_kwargs,
            )
        )
    except APIError:
        raise
    except Exception as exc:  # the template is the model's code; any failure is the input's
        message = f"the chat template could not render these messages: {exc}"
        raise bad_request(message, chat.names("messages")) from None
