"""Anthropic Messages requests as the neutral chat request: system and blocks -> messages
(tool_use -> tool_calls, tool_result -> tool messages, thinking -> reasoning_content), tools and
tool_choice -> OpenAI's shape, output_config.format -> the constraint; errors name Anthropic's
fields."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from localradix.server.anthropic.protocol import (
    Block,
    CountTokensRequest,
    Message,
    MessagesRequest,
    OutputConfig,
    Tool,
    ToolChoice,
)
from localradix.server.core import chat_fields
from localradix.server.core.chat_request import ChatRequest, ParamNames
from localradix.server.core.chat_template import template_vars
from localradix.server.core.served import served_model
from localradix.server.errors import bad_request
from localradix.server.tokenizer_manager import TokenizerManager

# Claude Code's first system line: a value that changes every request (`cch=`), which would
# end every request's cached prefix there (`--keep-billing-header` keeps it).
BILLING_HEADER = "x-anthropic-billing-header:"

# Neutral field -> Anthropic's name for it (for error messages).
NAMES = ParamNames({"stop": "stop_sequences", "response_format": "output_config.format"})


def _text(blocks: str | list[Block] | None, where: str) -> str:
    """Text blocks joined; anything else (images, documents) is refused, naming the place."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    texts = []
    for block in blocks:
        if block.type != "text" or block.text is None:
            raise bad_request(f"{where}: only text blocks are supported here, not '{block.type}'")
        texts.append(block.text)
    return "".join(texts)


def _user(msg: Message, i: int) -> list[dict[str, Any]]:
    """A user turn: its tool results (as tool messages, first) and its text."""
    if isinstance(msg.content, str):
        return [{"role": "user", "content": msg.content}]
    out, texts = [], []
    for j, block in enumerate(msg.content):
        where = f"messages[{i}].content[{j}]"
        if block.type == "tool_result":
            if not block.tool_use_id:
                raise bad_request(f"{where}: a tool_result needs 'tool_use_id'")
            content = _text(block.content, where)
            if block.is_error:
                content = f"Error: {content}"
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
        elif block.type == "text" and block.text is not None:
            texts.append(block.text)
        else:
            raise bad_request(f"{where}: '{block.type}' blocks are not supported in a user turn")
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant(msg: Message, i: int) -> dict[str, Any]:
    """An assistant turn: text, thinking (reasoning_content) and tool_use (tool_calls)."""
    if isinstance(msg.content, str):
        return {"role": "assistant", "content": msg.content}
    texts, thinking, calls = [], [], []
    for j, block in enumerate(msg.content):
        if block.type == "text" and block.text is not None:
            texts.append(block.text)
        elif block.type == "thinking":
            thinking.append(block.thinking or "")
        elif block.type == "redacted_thinking":
            continue
        elif block.type == "tool_use" and block.id and block.name:
            function = {"name": block.name, "arguments": block.input or {}}
            calls.append({"id": block.id, "type": "function", "function": function})
        else:
            where = f"messages[{i}].content[{j}]"
            raise bad_request(
                f"{where}: '{block.type}' blocks are not supported in an assistant turn"
            )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        out["reasoning_content"] = "".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


def _system(system: str | list[Block], keep_header: bool) -> str:
    """The system prompt's text, less Claude Code's per-request billing line unless kept."""
    if keep_header:
        return _text(system, "system")
    if isinstance(system, str):
        return _without_header(system)
    text = _text(system, "system")  # refuses non-text blocks first
    return "".join(_without_header(block.text or "") for block in system) if text else ""


def _without_header(text: str) -> str:
    """`text` less a first line that is the billing header (the whole text if it is one)."""
    if not text.lstrip().startswith(BILLING_HEADER):
        return text
    _, newline, rest = text.lstrip().partition("\n")
    return rest if newline else ""


def _messages(req: CountTokensRequest, keep_header: bool = False) -> list[dict[str, Any]]:
    out = []
    system = _system(req.system, keep_header) if req.system else ""
    if system:
        out.append({"role": "system", "content": system})
    for i, msg in enumerate(req.messages):
        if msg.role == "user":
            out.extend(_user(msg, i))
        else:
            out.append(_assistant(msg, i))
    return out


def _tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise bad_request(f"tools[{i}]: server tool '{tool.type}' is not supported")
        schema = tool.input_schema or {"type": "object", "properties": {}}
        function = {"name": tool.name, "description": tool.description or "", "parameters": schema}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: ToolChoice | None) -> tuple[Any, bool]:
    """Anthropic's tool_choice as OpenAI's, and whether parallel calls are allowed."""
    if choice is None:
        return None, True
    parallel = not choice.disable_parallel_tool_use
    if choice.type in ("auto", "none"):
        return choice.type, parallel
    if choice.type == "any":
        return "required", parallel
    if choice.type == "tool" and choice.name:
        return {"type": "function", "function": {"name": choice.name}}, parallel
    raise bad_request(
        "tool_choice.type must be 'auto', 'any', 'none' or 'tool' (with 'name'), "
        f"not {choice.type!r}"
    )


def _output_format(config: OutputConfig | None) -> dict[str, Any] | None:
    if config is None or config.format is None:
        return None
    if config.format.type != "json_schema":
        raise bad_request(
            f"output_config.format.type must be 'json_schema', not {config.format.type!r}"
        )
    schema = {"name": "output", "schema": config.format.schema}
    return {"type": "json_schema", "json_schema": schema}


def _thinking(thinking: dict[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """Anthropic's `thinking` switch as the template's (enable_thinking), and the reasoning
    effort: "disabled" is "none", so a forced tool call then starts at once, without reasoning."""
    kind = (thinking or {}).get("type")
    if kind == "disabled":
        return template_vars(None, "none"), "none"
    if kind in ("enabled", "adaptive"):
        return {"enable_thinking": True}, None
    return {}, None


def chat_request(manager: TokenizerManager, req: CountTokensRequest) -> ChatRequest:
    model = served_model(manager, req.model)
    messages = _messages(req, manager.args.keep_billing_header)
    tools = chat_fields.chat_tools(_tools(req.tools))
    choice, parallel = _tool_choice(req.tool_choice)
    kwargs, effort = _thinking(req.thinking)
    chat = ChatRequest(
        model=model,
        messages=chat_fields.chat_messages(messages, NAMES("messages")),
        tools=tools,
        tool_choice=chat_fields.chat_tool_choice(choice) if tools else None,
        parallel_tool_calls=parallel,
        template_kwargs=kwargs,
        reasoning_effort=effort,
        names=NAMES,
    )
    if not isinstance(req, MessagesRequest):
        return chat
    constraint, param = chat_fields.output_constraint(
        _output_format(req.output_config), NAMES("response_format")
    )
    values = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "stop": req.stop_sequences or None,
    }
    return replace(
        chat,
        sampling=chat_fields.sampling(values, NAMES),
        max_tokens=chat_fields.max_tokens(req.max_tokens, NAMES),
        constraint=constraint,
        constraint_param=param,
        stream=req.stream,
    )
