"""OpenAI's chat request as the neutral one: its body was checked when decoded, so this only
adds what needs two fields or the model (the served model, top_logprobs, one constraint)."""

from __future__ import annotations

import msgspec

from localradix.server.core.chat_request import ChatRequest, ParamNames
from localradix.server.core.chat_template import template_messages, template_vars
from localradix.server.core.sampling import request_constraint, sampling_of
from localradix.server.core.served import openai_not_found, served_model
from localradix.server.errors import bad_request
from localradix.server.protocol import ChatCompletionRequest
from localradix.server.tokenizer_manager import TokenizerManager


def chat_request(manager: TokenizerManager, req: ChatCompletionRequest) -> ChatRequest:
    served_model(manager, req.model, openai_not_found)
    constraint, constraint_param = request_constraint(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    completion = req.max_completion_tokens is not None
    names = ParamNames(
        {
            "max_tokens": "max_completion_tokens" if completion else "max_tokens",
            "logprobs": "top_logprobs",
        }
    )
    return ChatRequest(
        model=req.model,
        messages=template_messages(req.messages),
        sampling=sampling_of(req),
        tools=msgspec.to_builtins(req.tools) if req.tools else None,
        tool_choice=msgspec.to_builtins(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls,
        template_kwargs=template_vars(req.chat_template_kwargs, req.reasoning_effort),
        reasoning_effort=req.reasoning_effort,
        add_generation_prompt=req.add_generation_prompt,
        max_tokens=req.max_completion_tokens if completion else req.max_tokens,
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        constraint=constraint,
        constraint_param=constraint_param,
        stream=req.stream,
        names=names,
    )
