"""OpenAI chat and text completions: request -> token ids + SamplingParams -> Job -> response.

Everything a client can get wrong is checked here, before anything reaches the engine, and
raised as an APIError naming the parameter.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from localradix.messages import TokenLogprob
from localradix.parsers.events import ContentDelta, ToolCallDelta
from localradix.parsers.output_parser import (
    ChatDelta,
    ChatOutputParser,
    ParsedChatOutput,
    ReasoningContentDelta,
    parse_chat_output,
)
from localradix.parsers.reasoning import get_reasoning_parser
from localradix.parsers.tool_constraint import ToolChoiceError, tool_call_constraint
from localradix.sampling_params import Constraint, InvalidParams, SamplingParams
from localradix.server.errors import APIError, bad_request
from localradix.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    ResponseFormat,
    _SamplingFields,
)
from localradix.server.tokenizer_manager import Delta, Job, TokenizerManager

_json = msgspec.json.Encoder()
LONG_TEXT_CHARS = 4096  # tokenize longer prompts in a thread so the event loop keeps serving


def sse(payload: Any) -> bytes:
    return b"data: " + _json.encode(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


# ---- request -> job -------------------------------------------------------------------------


def sampling_params(
    req: _SamplingFields,
    max_tokens: int | None,
    logprobs: int | None,
    context: int,
    vocab: int,
    constraint: Constraint | None = None,
) -> SamplingParams:
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    top_k = -1 if not req.top_k else req.top_k  # None and 0: no top-k cut
    params = SamplingParams(
        # Past the context nothing more can be generated; clamp so huge values stay small.
        max_new_tokens=context if max_tokens is None else min(max_tokens, context),
        temperature=_default(req.temperature, 1.0),
        top_p=_default(req.top_p, 1.0),
        top_k=min(top_k, vocab) if vocab and top_k > vocab else top_k,
        min_p=_default(req.min_p, 0.0),
        repetition_penalty=_default(req.repetition_penalty, 1.0),
        presence_penalty=_default(req.presence_penalty, 0.0),
        frequency_penalty=_default(req.frequency_penalty, 0.0),
        seed=req.seed,
        stop=stop,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        n=req.n,
        logprobs=logprobs,
        skip_special_tokens=req.skip_special_tokens,
        constraint=constraint,
    )
    if vocab and any(not 0 <= t < vocab for t in params.stop_token_ids):
        raise bad_request(f"stop token ids must be in [0, {vocab})", "stop_token_ids")
    try:
        return params.validate()
    except InvalidParams as exc:
        raise bad_request(str(exc), exc.param) from None


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def max_tokens_or_default(manager: TokenizerManager, requested: int | None) -> int | None:
    """The request's max_tokens, or --default-max-tokens when it has none (None: no cap, the
    reply may run to the context length)."""
    if requested is not None:
        return requested
    default = manager.args.default_max_tokens
    return default if default > 0 else None


# ---- structured output and tools ------------------------------------------------------------


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


def _response_format(rf: ResponseFormat) -> Constraint | None:
    if isinstance(rf, JsonSchemaFormat):
        return Constraint("json_schema", json.dumps(rf.json_schema.schema))
    if isinstance(rf, JsonObjectFormat):
        return Constraint("json_object")
    return None  # type "text"


@dataclass(frozen=True)
class ChatOutputSpec:
    """How a chat job's outputs are split into reasoning, content and tool calls."""

    tool_parser: str | None = None
    reasoning_parser: str | None = None
    starts_in_reasoning: bool | None = None
    tool_names: tuple[str, ...] | None = None

    # Calls are sent whole once complete, and a call the output cuts off (max_tokens) is
    # dropped, never shown as content or as a call with broken arguments.
    def stream_parser(self) -> ChatOutputParser:
        return ChatOutputParser(
            tool_parser=self.tool_parser,
            reasoning_parser=self.reasoning_parser,
            starts_in_reasoning=self.starts_in_reasoning,
            tool_names=self.tool_names,
            complete_calls=True,
        )

    def parse(self, text: str) -> ParsedChatOutput:
        if self.tool_parser is None and self.reasoning_parser is None:
            return ParsedChatOutput(None, text)
        return parse_chat_output(
            text,
            tool_parser=self.tool_parser,
            reasoning_parser=self.reasoning_parser,
            starts_in_reasoning=self.starts_in_reasoning,
            tool_names=self.tool_names,
            complete_calls=True,
        )


PLAIN_OUTPUT = ChatOutputSpec()


def _tool_setup(
    manager: TokenizerManager, req: ChatCompletionRequest, prompt: str
) -> tuple[ChatOutputSpec, Constraint | None]:
    """The output parsers for this request, and the constraint its tool_choice forces."""
    tools = msgspec.to_builtins(req.tools) if req.tools else None
    choice = msgspec.to_builtins(req.tool_choice)
    if choice is None:
        choice = "auto" if tools else "none"
    reasoning = manager.reasoning_parser
    starts = get_reasoning_parser(reasoning).prompt_opens_reasoning(prompt) if reasoning else None
    dialect = manager.tool_parser if tools and choice != "none" else None
    constraint = None
    if choice not in ("none", "auto"):
        if manager.tool_parser is None:
            raise bad_request(
                "this tool_choice needs a tool-call parser, but the server runs with "
                "--tool-call-parser none",
                "tool_choice",
            )
        try:
            constraint = tool_call_constraint(
                tools,
                choice,
                manager.tool_parser,
                req.parallel_tool_calls,
                reasoning=reasoning,
                starts_in_reasoning=bool(starts),
            )
        except ToolChoiceError as exc:
            raise bad_request(str(exc), "tool_choice") from None
        dialect = manager.tool_parser
    names = tuple(t.function.name for t in req.tools or ()) if dialect else None
    return ChatOutputSpec(dialect, reasoning, starts, names), constraint


def check_model(manager: TokenizerManager, model: str | None) -> None:
    served = manager.client.info.get("name")
    if model is not None and model != served:
        raise APIError(
            404,
            f"the model '{model}' does not exist; this server serves '{served}'",
            param="model",
            code="model_not_found",
            type="invalid_request_error",
        )


async def encode(manager: TokenizerManager, text: str) -> list[int]:
    if len(text) > LONG_TEXT_CHARS:
        return await asyncio.to_thread(manager.tokenizer.encode, text, False)
    return manager.tokenizer.encode(text, False)


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for msg in req.messages:
        item = {f: v for f in msg.__struct_fields__ if (v := getattr(msg, f)) is not None}
        if isinstance(msg.content, list):
            item["content"] = _text_content(msg.content)
        if msg.tool_calls:
            item["tool_calls"] = [_template_call(call) for call in msg.tool_calls]
            item.setdefault("content", "")  # templates read content even beside tool calls
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


def _text_content(parts: Sequence[Any]) -> str:
    return "".join(part.text for part in parts)  # the protocol admits text parts only


async def chat_job(manager: TokenizerManager, req: ChatCompletionRequest) -> Job:
    check_model(manager, req.model)
    constraint, constraint_param = request_constraint(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    try:
        tools = msgspec.to_builtins(req.tools) if req.tools else None
        text = manager.tokenizer.apply_chat_template(
            chat_messages(req), tools=tools, add_generation_prompt=req.add_generation_prompt
        )
    except APIError:
        raise
    except Exception as exc:  # the template is the model's code; any failure is the input's
        message = f"the chat template could not render these messages: {exc}"
        raise bad_request(message, "messages") from None
    output, tool_constraint = _tool_setup(manager, req, text)
    if tool_constraint is not None:  # forced tool calls win over response_format
        constraint, constraint_param = tool_constraint, "tool_choice"
    ids = await encode(manager, text)
    manager.check_prompt(ids, "messages")
    max_tokens = max_tokens_or_default(
        manager,
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens,
    )
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = _with_param_name(
        lambda: sampling_params(
            req, max_tokens, logprobs, manager.context_length, manager.vocab, constraint
        ),
        {"max_tokens": param, "logprobs": "top_logprobs"},
    )
    job = manager.submit([ids], params)
    job.constraint_param = constraint_param
    job.output = output
    return job


async def completion_job(manager: TokenizerManager, req: CompletionRequest) -> Job:
    check_model(manager, req.model)
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("'best_of' must equal 'n' (or be omitted)", "best_of")
    if req.echo and req.stream and req.logprobs is not None:
        raise bad_request("'echo' with 'logprobs' is not supported when streaming", "echo")
    constraint, constraint_param = request_constraint(req)
    prompts = await _completion_prompts(manager, req.prompt)
    for ids in prompts:
        manager.check_prompt(ids, "prompt")
    max_tokens = max_tokens_or_default(manager, req.max_tokens)
    params = sampling_params(
        req, max_tokens, req.logprobs, manager.context_length, manager.vocab, constraint
    )
    job = manager.submit(prompts, params)
    job.constraint_param = constraint_param
    return job


async def _completion_prompts(manager: TokenizerManager, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [await encode(manager, prompt)]
    if all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    elif all(isinstance(p, str) for p in prompt):
        prompts = [await encode(manager, p) for p in prompt]
    elif all(isinstance(p, list) for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise bad_request("'prompt' mixes strings, token ids and lists", "prompt")
    if len(prompts) > 64:
        raise bad_request("at most 64 prompts per request", "prompt")
    vocab = manager.vocab
    for ids in prompts:
        if vocab and any(not 0 <= t < vocab for t in ids):
            raise bad_request(f"token ids must be in [0, {vocab})", "prompt")
    return prompts


def _with_param_name(build: Any, renames: dict[str, str]) -> SamplingParams:
    try:
        return build()
    except APIError as exc:
        exc.param = renames.get(exc.param or "", exc.param)
        exc.message = exc.message.replace("'max_tokens'", f"'{exc.param}'")
        raise


# ---- job -> responses -----------------------------------------------------------------------


class Gathered:
    """A finished job's text, finish reasons and logprobs per choice."""

    def __init__(self, job: Job) -> None:
        self.job = job
        count = len(job.choices)
        self.text = [""] * count
        self.finish: list[str | None] = [None] * count
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(count)]

    async def run(self) -> Gathered:
        async for batch in self.job.deltas():
            for d in batch:
                self.text[d.index] += d.text
                self.logprobs[d.index].extend(d.logprobs)
                if d.finish_reason:
                    self.finish[d.index] = d.finish_reason
        return self


def chat_logprobs(manager: TokenizerManager, lps: Sequence[TokenLogprob]) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = manager.token_text(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode())}

    return {
        "content": [
            {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
            for lp in lps
        ]
    }


def completion_logprobs(
    manager: TokenizerManager, lps: Sequence[TokenLogprob], offset: int
) -> dict[str, Any]:
    tokens, offsets = [], []
    for lp in lps:
        tokens.append(manager.token_text(lp.token_id))
        offsets.append(offset)
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [_finite(lp.logprob) for lp in lps],
        "top_logprobs": [{manager.token_text(t): _finite(v) for t, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def _finite(x: float) -> float:
    return x if x > -1e30 else -9999.0  # JSON has no -inf


def chat_response(g: Gathered, model: str, want_logprobs: bool) -> dict[str, Any]:
    manager = g.job.manager
    spec: ChatOutputSpec = g.job.output or PLAIN_OUTPUT
    choices = []
    for i in range(len(g.text)):
        parsed = spec.parse(g.text[i])
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        finish = g.finish[i]
        if parsed.calls:
            message["tool_calls"] = [call.to_openai() for call in parsed.calls]
            if not parsed.content.strip():
                message["content"] = None
            finish = _tool_finish(finish)
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": chat_logprobs(manager, g.logprobs[i]) if want_logprobs else None,
                "finish_reason": finish,
            }
        )
    return _envelope(g.job, "chatcmpl", "chat.completion", model, choices, g.job.usage())


def completion_response(
    g: Gathered, model: str, req: CompletionRequest, prompt_texts: list[str]
) -> dict[str, Any]:
    manager, n = g.job.manager, req.n
    choices = []
    for i in range(len(g.text)):
        prefix = prompt_texts[i // n] if req.echo else ""
        lp = None
        if req.logprobs is not None:
            lp = completion_logprobs(manager, g.logprobs[i], len(prefix))
        choices.append(
            {"index": i, "text": prefix + g.text[i], "logprobs": lp, "finish_reason": g.finish[i]}
        )
    return _envelope(g.job, "cmpl", "text_completion", model, choices, g.job.usage())


def _envelope(
    job: Job, prefix: str, obj: str, model: str, choices: list[Any], usage: Any
) -> dict[str, Any]:
    body = {"id": f"{prefix}-{job.rid}", "object": obj, "created": job.created, "model": model}
    body["choices"] = choices
    if usage is not None:
        body["usage"] = usage
    return body


async def chat_stream(
    job: Job, model: str, want_logprobs: bool, include_usage: bool
) -> AsyncIterator[bytes]:
    manager = job.manager

    def chunk(choices: list[Any], usage: Any = None) -> bytes:
        return sse(_envelope(job, "chatcmpl", "chat.completion.chunk", model, choices, usage))

    first = [
        {"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        for c in job.choices
    ]

    spec: ChatOutputSpec = job.output or PLAIN_OUTPUT
    parsers = {c.index: spec.stream_parser() for c in job.choices}
    called: set[int] = set()  # choices that emitted a tool call

    def choice(d: Delta) -> dict[str, Any] | None:
        parser = parsers[d.index]
        events = parser.feed(d.text) if d.text else []
        if d.finish_reason:
            events += parser.finish()
        delta = chat_delta(events)
        if "tool_calls" in delta:
            called.add(d.index)
        lp = chat_logprobs(manager, d.logprobs) if want_logprobs and d.logprobs else None
        finish = d.finish_reason
        if finish and d.index in called:
            finish = _tool_finish(finish)
        if not delta and not finish:
            if lp is None:
                return None  # the parser holds the text back (a tag may be starting)
            delta = {"content": ""}
        return {"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": finish}

    try:
        yield chunk([{**c, "finish_reason": None} for c in first])
        async for part in _stream_errors(job):
            if isinstance(part, bytes):
                yield part
                return
            choices = [
                c
                for d in part
                if (d.text or d.logprobs or d.finish_reason) and (c := choice(d)) is not None
            ]
            if choices:
                yield chunk(choices)
        if include_usage:
            yield chunk([], job.usage())
        yield SSE_DONE
    finally:
        job.close()  # a client that went away mid-stream aborts what is left


def chat_delta(events: Sequence[ChatDelta]) -> dict[str, Any]:
    """One `choices[].delta` from parser events: reasoning_content, content, tool_calls."""
    delta: dict[str, Any] = {}
    for event in events:
        if isinstance(event, ContentDelta):
            delta["content"] = delta.get("content", "") + event.text
        elif isinstance(event, ReasoningContentDelta):
            delta["reasoning_content"] = delta.get("reasoning_content", "") + event.text
        elif isinstance(event, ToolCallDelta):
            delta.setdefault("tool_calls", []).append(event.to_openai())
    return delta


def _tool_finish(finish: str | None) -> str | None:
    """A choice that made tool calls ends with "tool_calls", unless it ran out of tokens."""
    return "tool_calls" if finish == "stop" else finish


async def completion_stream(
    job: Job, model: str, req: CompletionRequest, prompt_texts: list[str]
) -> AsyncIterator[bytes]:
    manager, n = job.manager, req.n
    echo_pending = {c.index for c in job.choices} if req.echo else set()
    offsets = [0] * len(job.choices)

    def choice(d: Delta) -> dict[str, Any]:
        text = d.text
        if d.index in echo_pending:
            echo_pending.discard(d.index)
            text = prompt_texts[d.index // n] + text
        lp = None
        if req.logprobs is not None:
            lp = completion_logprobs(manager, d.logprobs, offsets[d.index])
        offsets[d.index] += len(text)
        return {"index": d.index, "text": text, "logprobs": lp, "finish_reason": d.finish_reason}

    def chunk(choices: list[Any], usage: Any = None) -> bytes:
        return sse(_envelope(job, "cmpl", "text_completion", model, choices, usage))

    try:
        async for part in _stream_errors(job):
            if isinstance(part, bytes):
                yield part
                return
            choices = [
                choice(d)
                for d in part
                if d.text or d.logprobs or d.finish_reason or d.index in echo_pending
            ]
            if choices:
                yield chunk(choices)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield chunk([], job.usage())
        yield SSE_DONE
    finally:
        job.close()


async def _stream_errors(job: Job) -> AsyncIterator[list[Delta] | bytes]:
    """The job's batches; an error after the headers went out becomes an SSE error event."""
    try:
        async for batch in job.deltas():
            yield batch
    except APIError as exc:
        job.manager.metrics.record_error(exc.status)
        yield sse(exc.body()) + SSE_DONE
