"""`localradix.Engine`: the whole engine in-process, for scripts and tests (no server).

A background thread owns the EngineCore and runs its loop; callers hand it requests through a
queue and receive outputs through callbacks, so both the blocking `generate` and the asyncio
`stream` are safe to use from any thread.
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
from localradix.messages import AbortRequest, GenerateRequest, RequestOutput, TokenLogprob
from localradix.sampling_params import SamplingParams

logger = logging.getLogger("localradix.engine")

Prompt = str | Sequence[int]


@dataclass
class GenerateResult:
    rid: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    error: str | None = None

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
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._callbacks: dict[str, Callable[[RequestOutput], None]] = {}
        self._ids = itertools.count()
        self._closed = False
        self._dead: Exception | None = None
        # The core is built on the loop's thread, which alone touches it (llama.cpp's OpenMP
        # team belongs to the thread that first runs it; a second thread's team slows both).
        built: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(
            target=self._loop, args=(lambda: EngineCore(self.args), built), daemon=True,
            name="localradix-engine",
        )  # fmt: skip
        self._thread.start()
        core = built.get()
        if isinstance(core, BaseException):
            self._thread.join()
            raise core
        self.core: EngineCore = core
        self.tokenizer = core.tokenizer

    # ---- public API ----------------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[GenerateResult]:
        """Generate for one or many prompts; blocks until all are done. n > 1 adds forks."""
        prompt_list = _as_prompt_list(prompts)
        param_list = _as_param_list(params, len(prompt_list))
        pending = [
            self._submit_blocking(prompt, p)
            for prompt, p0 in zip(prompt_list, param_list)
            for prompt, p in self._forks(prompt, p0)
        ]
        for done, _ in pending:
            done.wait()
        return [self._finish_text(result) for _, result in pending]

    async def stream(
        self, prompt: Prompt, params: SamplingParams | None = None
    ) -> AsyncIterator[StreamChunk]:
        """Yield text deltas of one request as they are generated (abort if the caller stops)."""
        from localradix.engine.detokenizer import IncrementalDetokenizer

        params = params or SamplingParams()
        loop = asyncio.get_running_loop()
        outbox: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def on_output(out: RequestOutput) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(outbox.put_nowait, out)

        rid = self._submit(prompt, params, on_output)
        detok = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens, params.stop)
        finished = False
        try:
            while not finished:
                out = await outbox.get()
                finished = out.finished
                text = detok.add(list(out.new_token_ids))
                if finished:
                    stop = out.matched_stop if isinstance(out.matched_stop, str) else None
                    text += detok.finish(stop)
                yield StreamChunk(text, out.new_token_ids, finished, out.finish_reason, out)
        finally:
            if not finished:
                self.abort(rid)

    def chat(
        self, messages: list[dict[str, Any]], params: SamplingParams | None = None
    ) -> GenerateResult:
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return self.generate([ids], params)[0]

    def abort(self, rid: str) -> None:
        self._inbox.put(AbortRequest(rid))

    def stats(self) -> Any:
        return self._call(lambda core: core.stats())

    def flush_cache(self) -> bool:
        return bool(self._call(lambda core: core.flush_cache()))

    def check_invariants(self, idle: bool = True) -> None:
        self._call(lambda core: core.scheduler.check_invariants(idle=idle))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._inbox.put(None)
            self._thread.join(timeout=30)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise RuntimeError(f"the engine loop crashed: {self._dead!r}") from self._dead

    def _forks(self, prompt: Prompt, params: SamplingParams) -> list[tuple[Prompt, SamplingParams]]:
        if params.n == 1:
            return [(prompt, params)]
        seeds = [None if params.seed is None else params.seed + i for i in range(params.n)]
        return [(prompt, params.replace(n=1, seed=s)) for s in seeds]

    def _submit(
        self, prompt: Prompt, params: SamplingParams, on_output: Callable[[RequestOutput], None]
    ) -> str:
        self._check_alive()
        rid = f"engine-{next(self._ids)}"
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._callbacks[rid] = on_output
        self._inbox.put(GenerateRequest(rid, tuple(int(t) for t in ids), params))
        return rid

    def _submit_blocking(
        self, prompt: Prompt, params: SamplingParams
    ) -> tuple[threading.Event, GenerateResult]:
        done = threading.Event()
        result = GenerateResult(rid="")

        def on_output(out: RequestOutput) -> None:
            result.token_ids.extend(out.new_token_ids)
            result.logprobs.extend(out.logprobs)
            if out.finished:
                result.finish_reason, result.error = out.finish_reason, out.error
                result.prompt_tokens, result.cached_tokens = out.prompt_tokens, out.cached_tokens
                result.matched_stop = out.matched_stop
                done.set()

        result.rid = self._submit(prompt, params, on_output)
        return done, result

    def _finish_text(self, result: GenerateResult) -> GenerateResult:
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        stop = result.matched_stop
        if isinstance(stop, str) and stop in text:
            text = text[: text.index(stop)]
        result.text = text
        return result

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(core)` on the engine thread and return its result."""
        self._check_alive()
        reply: queue.Queue[Any] = queue.Queue()
        self._inbox.put(("call", fn, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def _loop(self, build: Callable[[], Any], built: queue.Queue[Any]) -> None:
        try:
            core = build()
        except BaseException as exc:
            built.put(exc)
            return
        built.put(core)
        try:
            self._run_loop(core)
        except Exception as exc:  # a bug or a device error: fail every waiter, never hang them
            logger.exception("engine loop crashed")
            self._dead = exc
            for rid, callback in list(self._callbacks.items()):
                self._deliver(callback, RequestOutput(rid, (), True, "error", error=repr(exc)))
            self._callbacks.clear()
            self._drain_calls(exc)

    def _run_loop(self, core: Any) -> None:
        while True:
            block = not core.has_work()
            try:
                while True:
                    msg = self._inbox.get(block=block)
                    block = False
                    if msg is None:
                        return
                    self._handle(core, msg)
            except queue.Empty:
                pass
            for out in core.step():
                callback = self._callbacks.get(out.rid)
                if out.finished:
                    self._callbacks.pop(out.rid, None)
                if callback is not None:
                    self._deliver(callback, out)

    @staticmethod
    def _deliver(callback: Callable[[RequestOutput], None], out: RequestOutput) -> None:
        try:
            callback(out)
        except Exception:  # e.g. the caller's event loop closed: its problem, not the engine's
            logger.debug("dropped output for %s", out.rid, exc_info=True)

    def _drain_calls(self, exc: Exception) -> None:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, tuple):
                msg[2].put((False, RuntimeError(f"the engine loop crashed: {exc!r}")))

    @staticmethod
    def _handle(core: Any, msg: Any) -> None:
        if isinstance(msg, GenerateRequest):
            core.add_request(msg)
        elif isinstance(msg, AbortRequest):
            core.abort(msg.rid)
        else:
            _, fn, reply = msg
            try:
                reply.put((True, fn(core)))
            except Exception as exc:  # reported to the caller's thread
                reply.put((False, exc))


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
