"""A request's sampling fields as `SamplingParams`, and its output constraint (grammar)."""

from __future__ import annotations

import json
from typing import Any

from localradix.sampling_params import Constraint, InvalidParams, SamplingParams
from localradix.server.core.chat_request import OPENAI_NAMES, ParamNames, Sampling
from localradix.server.errors import bad_request
from localradix.server.protocol import (
    JsonObjectFormat,
    JsonSchemaFormat,
    ResponseFormat,
    _SamplingFields,
)
from localradix.server.tokenizer_manager import TokenizerManager


def sampling_params(
    sampling: Sampling,
    max_tokens: int | None,
    logprobs: int | None,
    context: int,
    vocab: int,
    constraint: Constraint | None = None,
    names: ParamNames = OPENAI_NAMES,
) -> SamplingParams:
    """The engine's parameters; an out-of-range value is a 400 naming the dialect's field."""
    top_k = -1 if not sampling.top_k else sampling.top_k  # None and 0: no top-k cut
    params = SamplingParams(
        # Past the context nothing more can be generated; clamp so huge values stay small.
        max_new_tokens=context if max_tokens is None else min(max_tokens, context),
        temperature=_default(sampling.temperature, 1.0),
        top_p=_default(sampling.top_p, 1.0),
        top_k=min(top_k, vocab) if vocab and top_k > vocab else top_k,
        min_p=_default(sampling.min_p, 0.0),
        repetition_penalty=_default(sampling.repetition_penalty, 1.0),
        presence_penalty=_default(sampling.presence_penalty, 0.0),
        frequency_penalty=_default(sampling.frequency_penalty, 0.0),
        seed=sampling.seed,
        stop=sampling.stop,
        stop_token_ids=sampling.stop_token_ids,
        ignore_eos=sampling.ignore_eos,
        n=sampling.n,
        logprobs=logprobs,
        skip_special_tokens=sampling.skip_special_tokens,
        speculative=sampling.speculative,
        constraint=constraint,
    )
    what = "stop token ids"
    check_token_ids(params.stop_token_ids, vocab, names("stop_token_ids"), what)
    try:
        return params.validate()
    except InvalidParams as exc:
        param = names(exc.param)
        why = str(exc).removeprefix(f"'{exc.param}' ")  # validate says "'<param>' <why>"
        raise bad_request(f"'{param}' {why}", param) from None


def sampling_of(req: _SamplingFields) -> Sampling:
    """An OpenAI request's sampling fields (validated when its body was decoded)."""
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return Sampling(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        seed=req.seed,
        stop=stop,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        n=req.n,
        ignore_eos=req.ignore_eos,
        skip_special_tokens=req.skip_special_tokens,
        speculative=req.speculative,
    )


def check_token_ids(ids: Any, vocab: int, param: str, what: str = "token ids") -> None:
    """Token ids a client sent must name tokens of the model (0: vocabulary size unknown)."""
    if vocab and any(not 0 <= t < vocab for t in ids):
        raise bad_request(f"{what} must be in [0, {vocab})", param)


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def max_tokens_or_default(manager: TokenizerManager, requested: int | None) -> int | None:
    """The request's max_tokens, or --default-max-tokens when it has none (None: no cap, the
    reply may run to the context length)."""
    if requested is not None:
        return requested
    default = manager.args.default_max_tokens
    return default if default > 0 else None


def request_constraint(req: _SamplingFields) -> tuple[Constraint | None, str | None]:
    """The request's grammar constraint and the parameter it came from (at most one given)."""
    found: list[tuple[Constraint, str]] = []
    if req.response_format is not None:
        constraint = _response_format(req.response_format)
        if constraint is not None:
            found.append((constraint, "response_format"))
    if req.regex is not None:
        found.append((Constraint("regex", req.regex), "regex"))
    if req.ebnf is not None:
        found.append((Constraint("ebnf", req.ebnf), "ebnf"))
    if len(found) > 1:
        names = " and ".join(f"'{param}'" for _, param in found)
        raise bad_request(f"give at most one output constraint, not {names}", found[1][1])
    return found[0] if found else (None, None)


def response_constraint(rf: ResponseFormat | None) -> Constraint | None:
    """The constraint a response_format asks for (None: plain text)."""
    return None if rf is None else _response_format(rf)


def _response_format(rf: ResponseFormat) -> Constraint | None:
    if isinstance(rf, JsonSchemaFormat):
        return Constraint("json_schema", json.dumps(rf.json_schema.schema))
    if isinstance(rf, JsonObjectFormat):
        return Constraint("json_object")
    return None  # type "text"
