"""A neutral chat request (any dialect's) or an OpenAI text completion as a `Job` on the engine.

What a client can get wrong is checked before anything reaches the engine (the dialect's
adapter checks its fields, this the rest) and raised as an APIError naming the parameter; the prompt itself is checked by the manager's
`check_prompt`, the one place that knows the engine's limits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from localradix.messages import CachePin
from localradix.server.core.chat_request import ChatRequest
from localradix.server.core.chat_template import chat_text
from localradix.server.core.fim import fim_prompt, require_fim
from localradix.server.core.output import tool_setup
from localradix.server.core.sampling import (
    max_tokens_or_default,
    request_constraint,
    sampling_of,
    sampling_params,
)
from localradix.server.core.served import openai_not_found, served_model
from localradix.server.errors import APIError, bad_request
from localradix.server.protocol import CompletionRequest
from localradix.server.tokenizer_manager import Job, TokenizerManager

LONG_TEXT_CHARS = 4096  # tokenize longer prompts in a thread so the event loop keeps serving
MAX_PROMPTS = 64


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


async def chat_job(
    manager: TokenizerManager,
    chat: ChatRequest,
    continues: Sequence[int] = (),
    pins_for: Callable[[list[int]], Awaitable[tuple[CachePin, ...]]] | None = None,
    context: Sequence[int] = (),
) -> Job:
    """The request's job; `continues`: an earlier prompt+output this prompt continues (Responses'
    previous_response_id), whose shared prefix must be served from the radix cache; `pins_for`:
    the prefixes of the prompt's ids to keep cached (Anthropic cache_control: the prompt is
    rendered and tokenized once, here); `context`: token ids the rendered prompt follows
    (Ollama's generate `context`), served from the cache where it still holds them."""
    text = chat_text(manager, chat)
    output, tool_constraint = tool_setup(manager, chat, text)
    constraint, constraint_param = chat.constraint, chat.constraint_param
    if tool_constraint is not None:  # forced tool calls win over response_format
        constraint, constraint_param = tool_constraint, chat.names("tool_choice")
    messages = chat.names("messages")
    ids = after_context(manager, context, await encode_prompt(manager, text, messages))
    manager.check_prompt(ids, messages)
    max_tokens = max_tokens_or_default(manager, chat.max_tokens)
    params = sampling_params(
        chat.sampling,
        max_tokens,
        chat.logprobs,
        manager.context_length,
        manager.vocab,
        constraint,
        chat.names,
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


# ---- text completion ------------------------------------------------------------------------


async def completion_job(manager: TokenizerManager, req: CompletionRequest) -> Job:
    served_model(manager, req.model, openai_not_found)
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
        sampling_of(req),
        max_tokens,
        req.logprobs,
        manager.context_length,
        manager.vocab,
        constraint,
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
