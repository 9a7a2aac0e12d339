"""Per-request state in the API process: fan a request out to the engine, gather its outputs.

One API request becomes a `Job` of `len(prompts) * n` engine requests (choices) with rids
`{rid}-{index}`; the radix cache shares their common prompt. Outputs arrive from the engine
client's dispatcher; `Job.deltas()` turns them into text deltas (detokenized here, off the engine
loop) for both streaming and non-streaming responses. A job that is dropped unfinished (client
disconnect, cancellation, error) aborts its remaining choices, which frees their KV.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from localradix.config import ServerArgs
from localradix.constrained.grammar import INVALID_GRAMMAR_PREFIX
from localradix.engine.detokenizer import IncrementalDetokenizer
from localradix.messages import AbortRequest, GenerateRequest, RequestOutput, TokenLogprob
from localradix.sampling_params import SamplingParams
from localradix.server.engine_client import EngineClient
from localradix.server.errors import APIError
from localradix.server.metrics import ServerMetrics

logger = logging.getLogger("localradix.server")


@dataclass
class Delta:
    """New output of one choice since the previous batch."""

    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(eq=False)
class Choice:
    index: int
    rid: str
    prompt_index: int
    detok: IncrementalDetokenizer
    finished: bool = False
    finish_reason: str | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0
    last_time: float | None = None


class Job:
    def __init__(
        self,
        manager: TokenizerManager,
        rid: str,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
    ) -> None:
        self.manager = manager
        self.rid = rid
        self.prompts = prompts
        self.params = params
        self.created = int(time.time())
        self.start = time.monotonic()
        self.choices: list[Choice] = []
        self._events: deque[tuple[Choice, RequestOutput | None]] = deque()
        self._wake = asyncio.Event()
        self._unfinished = 0
        # The request parameter a constraint came from: its compile error is a 400 naming it.
        self.constraint_param: str | None = None
        self.output: Any = None  # serving.ChatOutputSpec for chat jobs (how to parse outputs)

    # ---- engine side (called by the dispatcher) ------------------------------------------

    def _listener(self, choice: Choice) -> Any:
        def on_output(out: RequestOutput | None) -> None:
            self._events.append((choice, out))
            self._wake.set()

        return on_output

    # ---- consumer side -------------------------------------------------------------------

    async def deltas(self) -> AsyncIterator[list[Delta]]:
        """Batches of new output (one Delta per choice that changed) until every choice ends."""
        try:
            while self._unfinished:
                if not self._events:
                    self._wake.clear()
                    await self._wake.wait()
                batch: dict[int, Delta] = {}
                while self._events:
                    choice, out = self._events.popleft()
                    self._apply(choice, out, batch)
                if batch:
                    yield list(batch.values())
        finally:
            self.close()

    async def first_output(self) -> None:
        """Wait for the engine's first output (not consuming it); raise its error if it failed.

        Streaming responses of constrained requests call this before sending headers, so a
        grammar that does not compile is still a plain 400.
        """
        while self._unfinished and not self._events:
            self._wake.clear()
            await self._wake.wait()
        for _, out in self._events:
            self._check(out)

    def _check(self, out: RequestOutput | None) -> None:
        if out is None:
            raise APIError(503, self.manager.client.dead_message or "the engine is gone")
        if out.finish_reason == "error":
            error = out.error or "the engine rejected the request"
            if error.startswith(INVALID_GRAMMAR_PREFIX):
                raise APIError(
                    400,
                    error[len(INVALID_GRAMMAR_PREFIX) :],
                    param=self.constraint_param,
                    code="invalid_grammar",
                )
            raise APIError(400, error)

    def close(self) -> None:
        """Abort every choice still running (idempotent); frees their KV in the engine."""
        aborted = [c for c in self.choices if not c.finished]
        for choice in aborted:
            choice.finished = True
            self._done(choice)
        if aborted and self.manager.client.alive:
            self.manager.client.send([AbortRequest(c.rid) for c in aborted])

    def _apply(self, choice: Choice, out: RequestOutput | None, batch: dict[int, Delta]) -> None:
        if out is not None and choice.finished:
            return
        self._check(out)
        assert out is not None
        delta = batch.setdefault(choice.index, Delta(choice.index))
        ids, lps = out.new_token_ids, out.logprobs
        if out.finish_reason == "stop" and isinstance(out.matched_stop, int) and ids:
            if ids[-1] == out.matched_stop:  # the EOS / stop token itself is not text
                ids, lps = ids[:-1], lps[: len(ids) - 1]
        delta.text += choice.detok.add(ids)
        delta.logprobs.extend(lps)
        self._time_tokens(choice, len(out.new_token_ids))
        if out.finished:
            stop = out.matched_stop if isinstance(out.matched_stop, str) else None
            delta.text += choice.detok.finish(stop)
            choice.finished = True
            choice.finish_reason = delta.finish_reason = _finish_reason(out)
            choice.completion_tokens = out.completion_tokens
            choice.cached_tokens = out.cached_tokens
            self._done(choice, out)

    def _time_tokens(self, choice: Choice, n: int) -> None:
        if not n:
            return
        now = time.monotonic()
        metrics = self.manager.metrics
        if choice.last_time is None:
            metrics.ttft.observe(now - self.start)
        else:
            metrics.itl.observe((now - choice.last_time) / n, n)
        choice.last_time = now

    def _done(self, choice: Choice, out: RequestOutput | None = None) -> None:
        self._unfinished -= 1
        self.manager.in_flight -= 1
        self.manager.client.listeners.pop(choice.rid, None)
        if out is not None:
            self.manager.metrics.record_finish(
                choice.finish_reason or "abort",
                len(self.prompts[choice.prompt_index]),
                out.completion_tokens,
                out.cached_tokens,
            )
        if self._unfinished == 0:
            self.manager.metrics.e2e.observe(time.monotonic() - self.start)

    # ---- results -------------------------------------------------------------------------

    def usage(self) -> dict[str, Any]:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(c.completion_tokens for c in self.choices)
        cached = sum(
            min(c.cached_tokens for c in self.choices if c.prompt_index == i)
            for i in range(len(self.prompts))
        )
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }


def _finish_reason(out: RequestOutput) -> str:
    return {"stop": "stop", "length": "length"}.get(out.finish_reason or "", "abort")


def _tool_parser(setting: str, template: str | None) -> str | None:
    """The dialect for --tool-call-parser (used only for requests with tools); None: "none"."""
    from localradix.parsers.tool_calls import detect_tool_parser, get_tool_parser

    if setting == "none":
        return None
    if setting == "auto":
        return detect_tool_parser(template) or "hermes"
    get_tool_parser(setting)  # KeyError naming the known dialects
    return setting


def _reasoning_parser(setting: str | None, template: str | None) -> str | None:
    from localradix.parsers.reasoning import detect_reasoning_parser, get_reasoning_parser

    if setting is None or setting == "none":
        return None
    if setting == "auto":
        return detect_reasoning_parser(template)
    get_reasoning_parser(setting)  # KeyError naming the known dialects
    return setting


class TokenizerManager:
    def __init__(
        self, client: EngineClient, tokenizer: Any, args: ServerArgs, metrics: ServerMetrics
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.args = args
        self.metrics = metrics
        self.in_flight = 0  # engine requests sent and not finished
        self.capacity = args.max_running_requests + args.max_queued_requests
        self._ids = itertools.count()
        self._rid_prefix = os.urandom(4).hex()
        self._token_text: dict[int, str] = {}
        template = getattr(tokenizer, "chat_template", None)
        self.tool_parser = _tool_parser(args.tool_call_parser, template)
        self.reasoning_parser = _reasoning_parser(args.reasoning_parser, template)

    @property
    def context_length(self) -> int:
        return int(self.client.info["context_length"])

    @property
    def vocab(self) -> int:
        return int(self.client.info.get("vocab_size") or 0)

    def check_ready(self) -> None:
        if not self.client.alive:
            raise APIError(503, self.client.dead_message or "the engine is not ready yet")

    def new_rid(self) -> str:
        return f"{self._rid_prefix}{next(self._ids):x}"

    def check_prompt(self, ids: Sequence[int], param: str) -> None:
        """Reject prompts the engine could not take, with both lengths in the message."""
        if not ids:
            raise APIError(400, "the prompt is empty", param=param)
        context = self.context_length
        if len(ids) >= context:
            raise APIError(
                400,
                f"the prompt is {len(ids)} tokens long but the model's context length is "
                f"{context} tokens (the prompt must be shorter to leave room for output)",
                param=param,
                code="context_length_exceeded",
            )
        kv_total = int(self.client.info.get("kv_total_tokens") or 0)
        if kv_total and len(ids) + 1 > kv_total:
            raise APIError(
                400,
                f"the prompt is {len(ids)} tokens long but the KV cache holds {kv_total} tokens; "
                "the server needs a larger --max-total-tokens",
                param=param,
                code="context_length_exceeded",
            )

    def submit(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Job:
        """Send `len(prompts) * n` engine requests; 503 if the engine is gone, 429 when full."""
        self.check_ready()
        count = len(prompts) * params.n
        if self.in_flight + count > self.capacity:
            raise APIError(
                429,
                f"the server is at capacity ({self.in_flight} requests running or queued, "
                f"limit {self.capacity}); retry shortly",
                code="rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        job = Job(self, self.new_rid(), prompts, params)
        messages = []
        for p, ids in enumerate(prompts):
            for i in range(params.n):
                index = p * params.n + i
                seed = None if params.seed is None else params.seed + i
                choice = Choice(
                    index,
                    f"{job.rid}-{index}",
                    p,
                    IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens, params.stop),
                )
                job.choices.append(choice)
                messages.append(
                    GenerateRequest(choice.rid, tuple(ids), params.replace(n=1, seed=seed))
                )
        self.client.send(messages)  # no output can arrive before this coroutine yields
        for choice in job.choices:
            self.client.listeners[choice.rid] = job._listener(choice)
        job._unfinished = len(job.choices)
        self.in_flight += len(job.choices)
        return job

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text
