"""`localradix.Engine`: the whole engine in-process, for scripts and tests (no server).

A background thread runs the engine loop (engine/loop.py) over in-process queues: the same loop
the server's engine process runs over ZMQ. Requests are tracked by the same RequestTracker the
server's jobs wrap (fan-out of `n`, detokenizing, stop strings, finish reasons), on the caller's
side, so the same request gives the same text here and over HTTP; both the blocking `generate`
and the asyncio `stream` are safe to use from any thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from localradix.config import ServerArgs
from localradix.engine.loop import CoreCall, run_engine
from localradix.engine.tracker import (
    EMBED_PARAMS,
    Choice,
    Delta,
    RequestTracker,
    error_output,
)
from localradix.engine.transport import QueueTransport
from localradix.limits import RequestLimits
from localradix.messages import (
    AbortRequest,
    Embed,
    EngineEvent,
    ErrorCode,
    Fatal,
    GenerateRequest,
    LoadFailed,
    Ready,
    RequestOutput,
    Shutdown,
    StepOutputs,
    TokenLogprob,
)
from localradix.sampling_params import SamplingParams

logger = logging.getLogger("localradix.engine")

Prompt = str | Sequence[int]
Listener = Callable[[RequestOutput], None]


@dataclass
class GenerateResult:
    rid: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # the engine's: "stop" | "length" | "abort" | "error"
    matched_stop: int | str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    error: str | None = None
    error_code: ErrorCode | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class StreamChunk:
    text: str  # new text since the last chunk
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    output: RequestOutput


class Engine:
    def __init__(self, model: str | None = None, **server_args: Any) -> None:
        from localradix.engine.core import EngineCore

        self.args = ServerArgs(model=model, **server_args)
        self._inbox: queue.Queue[list[Any]] = queue.Queue()  # lists of messages for the loop
        self._listeners: dict[str, Listener] = {}
        self._ids = itertools.count()
        self._closed = False
        self._dead: str | None = None
        self._loaded: queue.Queue[Ready | LoadFailed] = queue.Queue(maxsize=1)
        failure: list[BaseException] = []

        def build() -> EngineCore:
            try:
                return EngineCore(self.args)
            except BaseException as exc:  # re-raised on the caller's thread, as itself
                failure.append(exc)
                raise

        transport = QueueTransport(self._inbox, self._on_event)
        # The core is built on the loop's thread, which alone touches it (llama.cpp's OpenMP
        # team belongs to the thread that first runs it; a second thread's team slows both).
        self._thread = threading.Thread(
            target=run_engine, args=(build, transport), daemon=True, name="localradix-engine"
        )
        self._thread.start()
        loaded = self._loaded.get()
        if isinstance(loaded, LoadFailed):
            self._thread.join()
            raise failure[0] if failure else RuntimeError(loaded.message)
        self.core: EngineCore = self._call(lambda core: core)
        self.tokenizer = self.core.tokenizer
        self.limits = RequestLimits.of(loaded.info)
        self.info = loaded.info

    # ---- public API ----------------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[GenerateResult]:
        """Generate for one or many prompts; blocks until all are done. n > 1 adds forks. A
        text prompt gets BOS where the tokenizer's rule adds one (as /v1/completions does)."""
        prompt_list = _as_prompt_list(prompts)
        param_list = _as_param_list(params, len(prompt_list))
        return [_result(c) for t in self._run(prompt_list, param_list) for c in t.choices]

    def embed(self, prompts: Prompt | Sequence[Prompt]) -> list[list[float]]:
        """The embedding of each prompt (text is tokenized with the tokenizer's special tokens,
        as sentence-transformers does), pooled as the model says (`ModelInfo.pooling`)."""
        if self.info.pooling is None:
            raise ValueError(f"{self.info.name} is not an embedding model: it cannot embed")
        embed = Embed(self.info.pooling, self.info.embed_normalize)
        prompt_list = [
            self.tokenizer.encode(p, add_special_tokens=True) if isinstance(p, str) else p
            for p in _as_prompt_list(prompts)
        ]
        params = [EMBED_PARAMS] * len(prompt_list)
        vectors = []
        for tracker in self._run(prompt_list, params, embed):
            final = tracker.choices[0].final
            if final is None or final.embedding is None:
                raise ValueError(final.error if final and final.error else "no embedding came")
            vectors.append(list(final.embedding))
        return vectors

    def _run(
        self,
        prompt_list: list[Prompt],
        param_list: list[SamplingParams],
        embed: Embed | None = None,
    ) -> list[RequestTracker]:
        """Send every prompt's requests in one go and wait until all are done."""
        arrived: queue.Queue[tuple[RequestTracker, Choice, RequestOutput]] = queue.Queue()
        tracked = [
            self._track(prompt, p, lambda t, c: lambda out: arrived.put((t, c, out)), embed)
            for prompt, p in zip(prompt_list, param_list)
        ]
        self._send([req for _, requests in tracked for req in requests])  # forks in one step
        trackers = [t for t, _ in tracked]
        # Fold the outputs in once all are in: detokenizing here while the loop runs would
        # take the GIL from it on every step.
        received, unfinished = [], sum(len(t.choices) for t in trackers)
        while unfinished:
            received.append(arrived.get())
            if received[-1][2].finished:
                unfinished -= 1
        for tracker, choice, out in received:
            tracker.apply(choice, out, Delta(choice.index))
        return trackers

    async def stream(
        self, prompt: Prompt, params: SamplingParams | None = None
    ) -> AsyncIterator[StreamChunk]:
        """Yield text deltas of one request as they are generated (abort if the caller stops)."""
        params = (params or SamplingParams()).replace(n=1)
        loop = asyncio.get_running_loop()
        outbox: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def on_output(out: RequestOutput) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(outbox.put_nowait, out)

        tracker, requests = self._track(prompt, params, lambda t, c: on_output)
        self._send(requests)
        choice = tracker.choices[0]
        try:
            while not choice.finished:
                out = await outbox.get()
                delta = Delta(choice.index)
                tracker.apply(choice, out, delta)
                yield StreamChunk(
                    delta.text, out.new_token_ids, out.finished, out.finish_reason, out
                )
        finally:
            if not choice.finished:
                self.abort(choice.rid)

    def chat(
        self, messages: list[dict[str, Any]], params: SamplingParams | None = None
    ) -> GenerateResult:
        return self.generate([self.chat_ids(messages)], params)[0]

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt a chat sends, as the server's chat route builds it: the messages through
        the chat template, then BOS by the tokenizer's rule (never a second one)."""
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return list(self.tokenizer.encode_prompt(prompt))

    def abort(self, rid: str) -> None:
        self._send([AbortRequest(rid)])

    def stats(self) -> Any:
        return self._call(lambda core: core.stats())

    def flush_cache(self) -> bool:
        return bool(self._call(lambda core: core.flush_cache()))

    def check_invariants(self, idle: bool = True) -> None:
        self._call(lambda core: core.scheduler.check_invariants(idle=idle))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._send([Shutdown()])
            self._thread.join(timeout=30)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise RuntimeError(f"the engine loop crashed: {self._dead}")

    def _send(self, messages: list[Any]) -> None:
        if messages:
            self._inbox.put(messages)

    def _track(
        self,
        prompt: Prompt,
        params: SamplingParams,
        listener_for: Callable[[RequestTracker, Choice], Listener],
        embed: Embed | None = None,
    ) -> tuple[RequestTracker, list[GenerateRequest]]:
        """Track one prompt's request and listen for its choices; the caller sends the engine
        requests. A prompt the engine cannot take gets none: its choices end at once, with the
        server's wording."""
        self._check_alive()
        # Text gets BOS by the tokenizer's rule, as over HTTP; token ids are sent as given.
        ids = self.tokenizer.encode_prompt(prompt) if isinstance(prompt, str) else list(prompt)
        ids = [int(t) for t in ids]
        rid = f"engine-{next(self._ids)}"
        tracker = RequestTracker(rid, [ids], params, self.tokenizer, embed)
        problem = self.limits.prompt_problem(ids)
        for choice in tracker.choices:
            listener = listener_for(tracker, choice)
            if problem is None:
                self._listeners[choice.rid] = listener
            else:
                listener(error_output(choice.rid, problem.message, ErrorCode.INVALID_REQUEST))
        return tracker, tracker.engine_requests() if problem is None else []

    def _on_event(self, event: EngineEvent) -> None:
        """Runs on the loop's thread: hand outputs to their listeners, nothing more."""
        if isinstance(event, StepOutputs):
            for out in event.outputs:
                listener = self._listeners.get(out.rid)
                if out.finished:
                    self._listeners.pop(out.rid, None)
                if listener is not None:
                    _deliver(listener, out)
        elif isinstance(event, (Ready, LoadFailed)):
            self._loaded.put(event)
        elif isinstance(event, Fatal):
            self._fail_everyone(event.message)

    def _fail_everyone(self, message: str) -> None:
        """The loop crashed: every waiter gets an error, never a hang."""
        self._dead = message
        for rid, listener in list(self._listeners.items()):
            _deliver(listener, error_output(rid, message, ErrorCode.ENGINE_FAILURE))
        self._listeners.clear()
        while True:
            try:
                messages = self._inbox.get_nowait()
            except queue.Empty:
                return
            for msg in messages:
                if isinstance(msg, CoreCall):
                    msg.reply.put((False, RuntimeError(f"the engine loop crashed: {message}")))

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(core)` on the loop's thread and return its result."""
        self._check_alive()
        reply: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self._send([CoreCall(fn, reply)])
        while True:
            try:
                ok, value = reply.get(timeout=0.5)
                break
            except queue.Empty:
                self._check_alive()  # the loop died after we asked
        if not ok:
            raise value
        return value


def _deliver(listener: Listener, out: RequestOutput) -> None:
    try:
        listener(out)
    except Exception:  # e.g. the caller's event loop closed: its problem, not the engine's
        logger.debug("dropped output for %s", out.rid, exc_info=True)


def _result(choice: Choice) -> GenerateResult:
    final = choice.final
    assert final is not None
    return GenerateResult(
        rid=choice.rid,
        text=choice.text,
        token_ids=choice.token_ids,
        finish_reason=final.finish_reason,
        matched_stop=final.matched_stop,
        prompt_tokens=final.prompt_tokens,
        cached_tokens=final.cached_tokens,
        logprobs=choice.logprobs,
        error=final.error,
        error_code=final.error_code,
    )


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if len(prompts) and isinstance(prompts[0], int):
        return [list(prompts)]  # type: ignore[arg-type]
    return list(prompts)  # type: ignore[arg-type]


def _as_param_list(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    assert len(params) == n, "one SamplingParams per prompt"
    return list(params)
