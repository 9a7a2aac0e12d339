"""Responses requests as the neutral chat request (errors name Responses' fields): `instructions` -> the system
message, input items -> messages (function_call -> an assistant's tool_calls,
function_call_output -> tool messages, reasoning -> reasoning_content), flat function tools and
tool_choice -> OpenAI's shape, text.format -> the constraint, max_output_tokens -> max_tokens."""

from __future__ import annotations

from typing import Any

from localradix.server.core import chat_fields
from localradix.server.core.chat_request import ChatRequest, ParamNames
from localradix.server.core.chat_template import template_vars
from localradix.server.errors import bad_request
from localradix.server.responses.protocol import (
    FunctionChoice,
    FunctionTool,
    InputItem,
    Part,
    ResponsesRequest,
    TextConfig,
)

# Neutral field -> the Responses field it came from (for error messages).
NAMES = ParamNames(
    {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input"}
)
TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _text(content: str | list[Part] | None, where: str) -> str:
    """Text parts joined; images, files and audio are refused, naming the place."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(_part_text(part, f"{where}[{j}]") for j, part in enumerate(content))


def _part_text(part: Part, where: str) -> str:
    if part.type not in TEXT_PARTS:
        raise bad_request(f"{where}: only text parts are supported, not '{part.type}'", where)
    if part.text is None:
        raise bad_request(f"{where}: '{part.type}' parts need 'text'", f"{where}.text")
    return part.text


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message a function_call belongs to: the last message if it is an
    assistant's, else a new one."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def _message(out: list[dict[str, Any]], item: InputItem, where: str) -> None:
    role = ROLES.get(item.role or "")
    if role is None:
        raise bad_request(
            f"{where}.role must be 'user', 'assistant', 'system' or 'developer', not {item.role!r}",
            f"{where}.role",
        )
    text = _text(item.content, f"{where}.content")
    last = out[-1] if out else None
    if role == "assistant" and last and last["role"] == "assistant" and "tool_calls" not in last:
        last["content"] += text  # after its reasoning item: the same turn
    else:
        out.append({"role": role, "content": text})


def _function_call(out: list[dict[str, Any]], item: InputItem, where: str) -> None:
    if not item.call_id or not item.name:
        raise bad_request(f"{where}: a function_call needs 'call_id' and 'name'", where)
    call = {"name": item.name, "arguments": item.arguments or "{}"}
    _assistant(out).setdefault("tool_calls", []).append(
        {"id": item.call_id, "type": "function", "function": call}
    )


def _call_output(out: list[dict[str, Any]], item: InputItem, where: str) -> None:
    if not item.call_id:
        raise bad_request(f"{where}: a function_call_output needs 'call_id'", where)
    content = _text(item.output, f"{where}.output")
    out.append({"role": "tool", "tool_call_id": item.call_id, "content": content})


def _reasoning(out: list[dict[str, Any]], item: InputItem, where: str) -> None:
    text = _text(item.content, f"{where}.content")
    if text:
        out.append({"role": "assistant", "content": "", "reasoning_content": text})


ITEMS = {
    "message": _message,
    "function_call": _function_call,
    "function_call_output": _call_output,
    "reasoning": _reasoning,
}


def input_messages(items: str | list[InputItem]) -> list[dict[str, Any]]:
    """The request's input as chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        add = ITEMS.get(item.type)
        if add is None:
            raise bad_request(
                f"input[{i}]: '{item.type}' items are not supported", f"input[{i}].type"
            )
        add(out, item, f"input[{i}]")
    return out


def _tools(tools: list[FunctionTool] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type != "function":
            raise bad_request(
                f"tools[{i}]: only function tools are supported, not '{tool.type}'",
                f"tools[{i}].type",
            )
        if not tool.name:
            raise bad_request(f"tools[{i}]: a function tool needs 'name'", f"tools[{i}].name")
        schema = tool.parameters or {"type": "object", "properties": {}}
        function = {"name": tool.name, "description": tool.description or "", "parameters": schema}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: str | FunctionChoice | None) -> Any:
    if choice is None or isinstance(choice, str):
        return choice  # "auto" | "none" | "required" (anything else: the core's 400)
    if choice.type == "function" and choice.name:
        return {"type": "function", "function": {"name": choice.name}}
    raise bad_request(
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        "tool_choice",
    )


def _response_format(text: TextConfig | None) -> dict[str, Any] | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.type == "json_schema":
        if fmt.schema is None:
            raise bad_request("text.format: json_schema needs 'schema'", "text.format.schema")
        spec = {"name": fmt.name or "output", "schema": fmt.schema, "strict": fmt.strict}
        return {
            "type": "json_schema",
            "json_schema": {k: v for k, v in spec.items() if v is not None},
        }
    raise bad_request(
        f"text.format.type must be 'text', 'json_object' or 'json_schema', not {fmt.type!r}",
        "text.format.type",
    )


def chat_request(
    req: ResponsesRequest, model: str, conversation: list[dict[str, Any]]
) -> ChatRequest:
    """The chat request for `conversation` (the earlier turns and this input, as messages)
    under this request's instructions, tools and sampling fields."""
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    tools = chat_fields.chat_tools(_tools(req.tools))
    choice = chat_fields.chat_tool_choice(_tool_choice(req.tool_choice)) if tools else None
    effort = req.reasoning.effort if req.reasoning else None
    constraint, param = chat_fields.output_constraint(
        _response_format(req.text), NAMES("response_format")
    )
    return ChatRequest(
        model=model,
        messages=chat_fields.chat_messages(system + conversation, NAMES("messages")),
        sampling=chat_fields.sampling({"temperature": req.temperature, "top_p": req.top_p}, NAMES),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls,
        template_kwargs=template_vars(None, effort),
        reasoning_effort=effort,
        max_tokens=chat_fields.max_tokens(req.max_output_tokens, NAMES),
        constraint=constraint,
        constraint_param=param,
        stream=req.stream,
        names=NAMES,
    )
