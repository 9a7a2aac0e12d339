"""OpenAI chat and text completions: request -> token ids + SamplingParams -> Job -> response.

Everything a client can get wrong is checked here, before anything reaches the engine, and
raised as an APIError naming the parameter.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec

from localradix.engine.messages import TokenLogprob
from localradix.sampling_params import InvalidParams, SamplingParams
from localradix.server.errors import APIError, bad_request
from localradix.server.protocol import ChatCompletionRequest, CompletionRequest, _SamplingFields
from localradix.server.tokenizer_manager import Delta, Job, TokenizerManager

_json = msgspec.json.Encoder()
LONG_TEXT_CHARS = 4096  # tokenize longer prompts in a thread so the event loop keeps serving


def sse(payload: Any) -> bytes:
    return b"data: " + _json.encode(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


# ---- request -> job -------------------------------------------------------------------------


def sampling_params(
    req: _SamplingFields, max_tokens: int | None, logprobs: int | None, context: int, vocab: int
) -> SamplingParams:
    if req.logit_bias:
        raise bad_request("'logit_bias' is not supported", "logit_bias")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    top_k = _default(req.top_k, -1)
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
    )
    if vocab and any(not 0 <= t < vocab for t in params.stop_token_ids):
        raise bad_request(f"stop token ids must be in [0, {vocab})", "stop_token_ids")
    try:
        return params.validate()
    except InvalidParams as exc:
        raise bad_request(str(exc), exc.param) from None


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


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
    if not req.messages:
        raise bad_request("'messages' must not be empty", "messages")
    out = []
    for i, msg in enumerate(req.messages):
        item = {f: v for f in msg.__struct_fields__ if (v := getattr(msg, f)) is not None}
        if isinstance(msg.content, list):
            item["content"] = _text_content(msg.content, f"messages[{i}].content")
        out.append(item)
    return out


def _text_content(parts: Sequence[Any], param: str) -> str:
    texts = []
    for part in parts:
        if part.type != "text" or part.text is None:
            raise bad_request(f"only text content parts are supported, not '{part.type}'", param)
        texts.append(part.text)
    return "".join(texts)


async def chat_job(manager: TokenizerManager, req: ChatCompletionRequest) -> Job:
    check_model(manager, req.model)
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise bad_request("only response_format type 'text' is supported", "response_format")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    try:
        text = manager.tokenizer.apply_chat_template(
            chat_messages(req), tools=req.tools, add_generation_prompt=req.add_generation_prompt
        )
    except APIError:
        raise
    except Exception as exc:  # the template is the model's code; any failure is the input's
        message = f"the chat template could not render these messages: {exc}"
        raise bad_request(message, "messages") from None
    ids = await encode(manager, text)
    manager.check_prompt(ids, "messages")
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = _with_param_name(
        lambda: sampling_params(req, max_tokens, logprobs, manager.context_length, manager.vocab),
        {"max_tokens": param, "logprobs": "top_logprobs"},
    )
    return manager.submit([ids], params)


async def completion_job(manager: TokenizerManager, req: CompletionRequest) -> Job:
    check_model(manager, req.model)
    if req.suffix:
        raise bad_request("'suffix' is not supported", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("'best_of' must equal 'n' (or be omitted)", "best_of")
    if req.echo and req.stream and req.logprobs is not None:
        raise bad_request("'echo' with 'logprobs' is not supported when streaming", "echo")
    prompts = await _completion_prompts(manager, req.prompt)
    for ids in prompts:
        manager.check_prompt(ids, "prompt")
    params = sampling_params(
        req, req.max_tokens, req.logprobs, manager.context_length, manager.vocab
    )
    if req.logprobs is not None and req.logprobs > 5:
        raise bad_request("'logprobs' must be in [0, 5]", "logprobs")
    return manager.submit(prompts, params)


async def _completion_prompts(manager: TokenizerManager, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [await encode(manager, prompt)]
    if not prompt:
        raise bad_request("'prompt' must not be empty", "prompt")
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
        self.finish = [None] * count
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
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": g.text[i]},
            "logprobs": chat_logprobs(manager, g.logprobs[i]) if want_logprobs else None,
            "finish_reason": g.finish[i],
        }
        for i in range(len(g.text))
    ]
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

    def choice(d: Delta) -> dict[str, Any]:
        lp = chat_logprobs(manager, d.logprobs) if want_logprobs and d.logprobs else None
        delta = {"content": d.text} if d.text or not d.finish_reason else {}
        return {"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": d.finish_reason}

    try:
        yield chunk([{**c, "finish_reason": None} for c in first])
        async for part in _stream_errors(job):
            if isinstance(part, bytes):
                yield part
                return
            choices = [choice(d) for d in part if d.text or d.logprobs or d.finish_reason]
            if choices:
                yield chunk(choices)
        if include_usage:
            yield chunk([], job.usage())
        yield SSE_DONE
    finally:
        job.close()  # a client that went away mid-stream aborts what is left


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
