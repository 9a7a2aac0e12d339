"""An OpenAI request (or a dialect's, converted to one) as a `Job` on the engine.

Everything a client can get wrong is checked here, before anything reaches the engine, and
raised as an APIError naming the parameter; the prompt itself is checked by the manager's
`check_prompt`, the one place that knows the engine's limits.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from localradix.loader.tool_prompt import involves_tools
from localradix.messages import CachePin
from localradix.sampling_params import SamplingParams
from localradix.server.core.fim import fim_prompt, require_fim
from localradix.server.core.output import tool_setup
from localradix.server.core.sampling import (
    max_tokens_or_default,
    request_constraint,
    sampling_params,
)
from localradix.server.errors import APIError, bad_request
from localradix.server.protocol import ChatCompletionRequest, CompletionRequest
from localradix.server.tokenizer_manager import Job, TokenizerManager

LONG_TEXT_CHARS = 4096  # tokenize longer prompts in a thread so the event loop keeps serving
MAX_PROMPTS = 64


def served_name(manager: TokenizerManager) -> str:
    return manager.client.loaded.name


def check_model(manager: TokenizerManager, model: str | None) -> None:
    """404 in OpenAI's words if `model` names another model than the one served."""
    served = served_name(manager)
    if model is not None and model != served and model not in manager.names:
        raise APIError(
            404,
            f"the model '{model}' does not exist; this server serves '{served}'",
            param="model",
            code="model_not_found",
            type="invalid_request_error",
        )


def served_model(manager: TokenizerManager, model: str | None, latest_ok: bool = False) -> str:
    """The served model's name for the other dialects; 404 in their words if `model` names
    another (`:latest` is Ollama's tag)."""
    served = served_name(manager)
    if model is None or model == served or (latest_ok and model == f"{served}:latest"):
        return served
    if model in manager.names or (latest_ok and model.removesuffix(":latest") in manager.names):
        return served
    raise APIError(404, f"model '{model}' not found; this server serves '{served}'")


async def encode(manager: TokenizerManager, text: str) -> list[int]:
    """A piece of a prompt (a FIM part, a file): its ids alone, no special tokens added."""
    return await _tokenized(manager.tokenizer.encode, text, False)


async def encode_prompt(
    manager: TokenizerManager, text: str, param: str | None = None
) -> list[int]:
    """A whole prompt: BOS (and EOS) where the model's tokenizer adds them, never a second BOS
    after a chat template's own; every route's usage.prompt_tokens counts these ids. With
    `param`, a text too long to fit the context in any tokenization is refused (a 400 naming
    it) before it is tokenized: an 8 MiB prompt costs seconds of tokenizer time otherwise."""
    if param is not None and len(text) > LONG_TEXT_CHARS:
        fewest = await asyncio.to_thread(manager.fewest_tokens, text)
        if fewest >= manager.context_length:
            raise APIError(
                400,
                f"the prompt is at least {fewest} tokens long ({len(text)} characters) but the "
                f"model's context length is {manager.context_length} tokens",
                param=param,
                code="context_length_exceeded",
            )
    return await _tokenized(manager.tokenizer.encode_prompt, text)


async def _tokenized(tokenize: Callable[..., Sequence[int]], text: str, *args: Any) -> list[int]:
    if len(text) > LONG_TEXT_CHARS:
        return list(await asyncio.to_thread(tokenize, text, *args))
    return list(tokenize(text, *args))


# ---- chat -----------------------------------------------------------------------------------


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for msg in req.messages:
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


def chat_text(manager: TokenizerManager, req: ChatCompletionRequest) -> str:
    """The request's messages through the model's chat template. Where the server writes the
    tools (the generic dialect), the template gets them and the tool history as text. With
    tool_choice "none" the tools stay in the prompt, as templates that write tools keep them:
    a turn that only switches tool_choice keeps its cached prefix (its output is not parsed
    for calls)."""
    try:
        tools = template_tools(msgspec.to_builtins(req.tools)) if req.tools else None
        extra = template_kwargs(req.chat_template_kwargs)
        extra = {**effort_kwargs(req.reasoning_effort), **extra}
        messages = chat_messages(req)
        if involves_tools(messages, tools) and manager.injects_tools:
            messages, tools = manager.tool_prompt.messages(messages, tools), None
        return str(
            manager.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=req.add_generation_prompt,
                **extra,
            )
        )
    except APIError:
        raise
    except Exception as exc:  # the template is the model's code; any failure is the input's
        message = f"the chat template could not render these messages: {exc}"
        raise bad_request(message, "messages") from None


RESERVED_TEMPLATE_NAMES = frozenset({"messages", "tools", "add_generation_prompt"})


def template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """`chat_template_kwargs` as given; a name the server sets itself is a 400."""
    taken = RESERVED_TEMPLATE_NAMES & set(kwargs or {})
    if taken:
        message = f"chat_template_kwargs may not set {', '.join(sorted(taken))}"
        raise bad_request(message, "chat_template_kwargs")
    return dict(kwargs or {})


async def chat_job(
    manager: TokenizerManager,
    req: ChatCompletionRequest,
    continues: Sequence[int] = (),
    pins_for: Callable[[list[int]], Awaitable[tuple[CachePin, ...]]] | None = None,
    context: Sequence[int] = (),
) -> Job:
    """The request's job; `continues`: an earlier prompt+output this prompt continues (Responses'
    previous_response_id), whose shared prefix must be served from the radix cache; `pins_for`:
    the prefixes of the prompt's ids to keep cached (Anthropic cache_control: the prompt is
    rendered and tokenized once, here); `context`: token ids the rendered prompt follows
    (Ollama's generate `context`), served from the cache where it still holds them."""
    check_model(manager, req.model)
    constraint, constraint_param = request_constraint(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    text = chat_text(manager, req)
    output, tool_constraint = tool_setup(manager, req, text)
    if tool_constraint is not None:  # forced tool calls win over response_format
        constraint, constraint_param = tool_constraint, "tool_choice"
    ids = after_context(manager, context, await encode_prompt(manager, text, "messages"))
    manager.check_prompt(ids, "messages")
    given = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = max_tokens_or_default(manager, given)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = _with_param_name(
        lambda: sampling_params(
            req, max_tokens, logprobs, manager.context_length, manager.vocab, constraint
        ),
        {"max_tokens": param, "logprobs": "top_logprobs"},
    )
    kept = manager.kept_special_ids(output.tool_parser, output.reasoning_parser)
    params = params.replace(kept_special_ids=kept)
    pins = await pins_for(ids) if pins_for is not None else ()
    continued = cached_continuation(ids, continues)
    return manager.submit([ids], params, pins, continued, None, constraint_param, output)


def after_context(manager: TokenizerManager, context: Sequence[int], ids: list[int]) -> list[int]:
    """A prompt's ids after `context` (which has its own BOS): without a BOS of their own."""
    if not context:
        return ids
    bos = getattr(manager.tokenizer, "bos_token_id", None)
    return [*context, *(ids[1:] if ids and ids[0] == bos else ids)]


def cached_continuation(ids: Sequence[int], earlier: Sequence[int]) -> int:
    """How many leading tokens of `ids` the cache holds from `earlier` (a prompt and its
    output): their common prefix, less the output's last token, whose KV was never computed."""
    n = min(len(ids), len(earlier) - 1)
    for i in range(max(n, 0)):
        if ids[i] != earlier[i]:
            return i
    return max(n, 0)


def _with_param_name(build: Callable[[], SamplingParams], renames: dict[str, str]) -> Any:
    try:
        return build()
    except APIError as exc:
        exc.param = renames.get(exc.param or "", exc.param)
        exc.message = exc.message.replace("'max_tokens'", f"'{exc.param}'")
        raise


# ---- text completion ------------------------------------------------------------------------


async def completion_job(manager: TokenizerManager, req: CompletionRequest) -> Job:
    check_model(manager, req.model)
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("'best_of' must equal 'n' (or be omitted)", "best_of")
    if req.echo and req.stream and req.logprobs is not None:
        raise bad_request("'echo' with 'logprobs' is not supported when streaming", "echo")
    constraint, constraint_param = request_constraint(req)
    if req.suffix:
        prompts = [await _fim_completion_prompt(manager, req.prompt, req.suffix)]
    elif req.prompt == "":
        raise bad_request("'prompt' must not be empty", "prompt")
    else:
        prompts = await _completion_prompts(manager, req.prompt)
    for ids in prompts:
        manager.check_prompt(ids, "prompt")
    max_tokens = max_tokens_or_default(manager, req.max_tokens)
    params = sampling_params(
        req, max_tokens, req.logprobs, manager.context_length, manager.vocab, constraint
    )
    return manager.submit(prompts, params, constraint_param=constraint_param)


async def _fim_completion_prompt(manager: TokenizerManager, prompt: Any, suffix: str) -> list[int]:
    """OpenAI's `suffix`: the prompt is the text before the gap, the suffix the text after."""
    fim = require_fim(manager.tokenizer, "suffix")
    if not isinstance(prompt, str):
        raise bad_request(
            "'suffix' needs 'prompt' as one string (the text before the gap)", "prompt"
        )
    prefix, after = await encode(manager, prompt), await encode(manager, suffix)
    return fim_prompt(fim, prefix, after, lead=manager.prompt_lead)


async def _completion_prompts(manager: TokenizerManager, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [await encode_prompt(manager, prompt, "prompt")]
    prompts: Sequence[list[int]]
    if all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    elif all(isinstance(p, str) for p in prompt):
        prompts = [await encode_prompt(manager, p, "prompt") for p in prompt]
    elif all(isinstance(p, list) for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise bad_request("'prompt' mixes strings, token ids and lists", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request", "prompt")
    return list(prompts)  # checked against the engine's limits by manager.check_prompt
