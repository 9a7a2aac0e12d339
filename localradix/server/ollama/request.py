"""Ollama requests for the core: a chat (and a templated generate) as the neutral chat
request, a raw or fill-in-the-middle generate as an OpenAI completion request; options ->
sampling, `format` -> the constraint, messages and tool calls -> OpenAI's shape. Errors name
Ollama's fields."""

from __future__ import annotations

from typing import Any

from localradix.server.core import chat_fields
from localradix.server.core.body import convert
from localradix.server.core.chat_request import ChatRequest, ParamNames
from localradix.server.core.chat_template import template_vars
from localradix.server.core.fim import require_fim
from localradix.server.core.sampling import check_token_ids
from localradix.server.core.served import served_model
from localradix.server.errors import bad_request
from localradix.server.ollama.protocol import ChatBody, GenerateBody, Message, Options, _Request
from localradix.server.protocol import CompletionRequest
from localradix.server.tokenizer_manager import TokenizerManager

# Neutral (OpenAI) field -> the Ollama option it came from (for error messages).
RENAMES = {
    "max_tokens": "num_predict",
    "repetition_penalty": "repeat_penalty",
    "response_format": "format",
}
NAMES = ParamNames(RENAMES)


def served(manager: TokenizerManager, model: str) -> str:
    if not model:
        raise bad_request("model is required", "model")
    return served_model(manager, model, latest_ok=True)


def _sampling(opts: Options | None, fmt: str | dict[str, Any] | None) -> dict[str, Any]:
    """Ollama options by their OpenAI names (None leaves the core's default), and
    `response_format`."""
    fields: dict[str, Any] = {"max_tokens": None, "response_format": _format(fmt)}
    if opts is None:
        return fields
    if opts.num_predict is not None and opts.num_predict >= 0:
        fields["max_tokens"] = opts.num_predict
    elif opts.num_predict not in (None, -1, -2):  # -1: no limit, -2: fill the context
        raise bad_request("num_predict must be >= 0, -1 (no limit) or -2 (fill the context)")
    top_k = opts.top_k
    if top_k is not None and top_k <= 0:  # Ollama: 0 disables top-k
        top_k = -1
    fields.update(
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=top_k,
        min_p=opts.min_p,
        stop=opts.stop or None,
        seed=opts.seed,
        repetition_penalty=opts.repeat_penalty,
        presence_penalty=opts.presence_penalty,
        frequency_penalty=opts.frequency_penalty,
    )
    # num_ctx: the context is fixed when the model loads; a prompt longer than it is a 400.
    return fields


def _format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise bad_request(f'invalid format {fmt!r}: give "json" or a JSON schema object', "format")


def _check_common(manager: TokenizerManager, body: _Request, model: str) -> None:
    # keep_alive was parsed (and a bad one refused) when the route acquired the model
    if body.images:
        raise bad_request("images are not supported: this model reads text only", "images")
    if body.logprobs:
        raise bad_request("logprobs are not supported on the Ollama API", "logprobs")
    if body.think not in (None, False) and manager.reasoning_parser is None:
        raise bad_request(f'"{model}" does not support thinking', "think")


def _thinking(think: Any) -> dict[str, Any] | None:
    """Ollama's `think` as the template variable thinking models read (Qwen3's
    `enable_thinking`); a template that does not read it renders as before."""
    return None if think is None else {"enable_thinking": think is not False}


def _tool_choice(opts: Options | None) -> Any:
    """`options.tool_choice` as OpenAI's: a bare function name names that function."""
    choice = opts.tool_choice if opts is not None else None
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        return {"type": "function", "function": {"name": choice}}
    return choice


def _message(msg: Message, i: int) -> dict[str, Any]:
    if msg.images:
        raise bad_request("images are not supported: this model reads text only", "images")
    out: dict[str, Any] = {"role": msg.role, "content": msg.content}
    if msg.thinking:
        out["reasoning_content"] = msg.thinking
    if msg.tool_name:
        out["name"] = msg.tool_name
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id or f"call_{i}_{j}",
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for j, call in enumerate(msg.tool_calls)
        ]
    return out


def _chat(
    model: str,
    fields: dict[str, Any],
    messages: list[dict[str, Any]],
    effort: str | None,
    kwargs: dict[str, Any] | None,
    **more: Any,
) -> ChatRequest:
    """The neutral chat request from `_sampling`'s fields, OpenAI-shaped messages, the
    reasoning effort and the template's variables."""
    constraint, param = chat_fields.output_constraint(
        fields.pop("response_format"), NAMES("response_format")
    )
    max_tokens = chat_fields.max_tokens(fields.pop("max_tokens"), NAMES)
    return ChatRequest(
        model=model,
        messages=chat_fields.chat_messages(messages, NAMES("messages")),
        sampling=chat_fields.sampling(fields, NAMES),
        template_kwargs=template_vars(kwargs, effort),
        reasoning_effort=effort,
        max_tokens=max_tokens,
        constraint=constraint,
        constraint_param=param,
        names=NAMES,
        **more,
    )


def chat_request(manager: TokenizerManager, body: ChatBody) -> ChatRequest:
    model = served(manager, body.model)
    _check_common(manager, body, model)
    fields = _sampling(body.options, body.format)
    messages = [_message(m, i) for i, m in enumerate(body.messages)]
    tools = chat_fields.chat_tools(body.tools)
    choice = chat_fields.chat_tool_choice(_tool_choice(body.options)) if tools else None
    effort = "none" if body.think is False else None
    return _chat(
        model,
        fields,
        messages,
        effort,
        _thinking(body.think),
        tools=tools,
        tool_choice=choice,
        stream=body.stream,
    )


def _check_context(manager: TokenizerManager, body: GenerateBody) -> None:
    """`context` (an earlier generate's prompt and output ids) continues a templated prompt."""
    if not body.context:
        return
    if body.raw or body.suffix:
        raise bad_request(
            "'context' continues a templated prompt: with raw or suffix, send the whole prompt",
            "context",
        )
    check_token_ids(body.context, manager.vocab, "context", "context token ids")


def generate_request(
    manager: TokenizerManager, body: GenerateBody
) -> ChatRequest | CompletionRequest:
    """`raw` prompts and fill-in-the-middle (`suffix`) go to the completion core; others
    through the chat template (after `context`, which the route hands to chat_job)."""
    model = served(manager, body.model)
    _check_common(manager, body, model)
    if body.template:
        raise bad_request(
            "a custom 'template' is not supported: the model's own chat template is used "
            "(send raw: true to send a prompt as it is)",
            "template",
        )
    _check_context(manager, body)
    fields = _sampling(body.options, body.format)
    if body.suffix:
        require_fim(manager.tokenizer, "suffix")  # Ollama's words before the core's
        fields["suffix"] = body.suffix
    if body.raw or body.suffix:
        fields.update(model=model, prompt=body.prompt)
        cleaned = {k: v for k, v in fields.items() if v is not None or k == "max_tokens"}
        return convert(cleaned, CompletionRequest, RENAMES)
    messages = [{"role": "system", "content": body.system}] if body.system else []
    messages.append({"role": "user", "content": body.prompt})
    # a generate's think is the template's switch alone (no reasoning effort)
    thinking = _thinking(body.think)
    return _chat(model, fields, messages, None, thinking, stream=body.stream)
