"""Per-request state in the API process: fan a request out to the engine, gather its outputs.

One API request becomes a `Job`: a RequestTracker (engine/tracker.py, shared with the in-process
`Engine`) of `len(prompts) * n` engine requests (choices), plus what the server adds: async
wake-ups, errors as APIError, latency metrics. Outputs arrive from the engine client's
dispatcher; `Job.deltas()` turns them into text deltas (detokenized here, off the engine loop)
for both streaming and non-streaming responses. A job that is dropped unfinished (client
disconnect, cancellation, error) aborts its remaining choices, which frees their KV.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from localradix.config import ServerArgs
from localradix.engine.tracker import Choice, Delta, RequestTracker
from localradix.limits import RequestLimits
from localradix.loader.tool_prompt import ToolPrompt
from localradix.messages import AbortRequest, CachePin, Embed, ErrorCode, RequestOutput
from localradix.parsers.output_parser import special_markers
from localradix.resolve import reasoning_parser_for, tool_parser_for
from localradix.sampling_params import SamplingParams
from localradix.server.engine_client import EngineClient
from localradix.server.errors import APIError
from localradix.server.metrics import ServerMetrics

if TYPE_CHECKING:  # server.core.output builds on this module
    from localradix.server.core.output import ChatOutputSpec

__all__ = ["Choice", "Delta", "Job", "TokenizerManager"]

logger = logging.getLogger("localradix.server")
LEAD_PROBE = "a"  # any text that is no special token


class Job:
    def __init__(
        self,
        manager: TokenizerManager,
        rid: str,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        embed: Embed | None = None,
        constraint_param: str | None = None,
        output: ChatOutputSpec | None = None,
        pins: tuple[CachePin, ...] = (),
    ) -> None:
        self.manager = manager
        self.pins = pins  # prefixes its prompt keeps cached (Anthropic cache_control)
        self.rid = rid
        self.prompts = prompts
        self.params = params
        self.created = int(time.time())
        self.start = time.monotonic()
        self.tracker = RequestTracker(rid, prompts, params, manager.tokenizer, embed)
        self.choices: list[Choice] = self.tracker.choices
        self._events: deque[tuple[Choice, RequestOutput | None]] = deque()
        self._wake = asyncio.Event()
        self._unfinished = len(self.choices)
        # The request parameter a constraint came from: its compile error is a 400 naming it.
        self.constraint_param = constraint_param
        self.output = output  # chat jobs: how to parse their outputs (tools, reasoning)

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
            if out.error_code is ErrorCode.INVALID_CONSTRAINT:
                raise APIError(400, error, param=self.constraint_param, code="invalid_grammar")
            if out.error_code is ErrorCode.PREFIX_EVICTED:
                raise APIError(400, error, code=ErrorCode.PREFIX_EVICTED.value)
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
        self.tracker.apply(choice, out, delta)
        self._time_tokens(choice, len(out.new_token_ids))
        if out.finished:
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
        return self.tracker.usage().as_dict()


class TokenizerManager:
    def __init__(
        self, client: EngineClient, tokenizer: Any, args: ServerArgs, metrics: ServerMetrics
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.args = args
        self.metrics = metrics
        self.in_flight = 0  # engine requests sent and not finished
        self.names: set[str] = set()  # request `model` names that mean this model (model_pool)
        self.capacity = args.max_running_requests + args.max_queued_requests
        self._token_text: dict[int, str] = {}
        template = getattr(tokenizer, "chat_template", None)
        self.tool_parser = tool_parser_for(args.tool_call_parser, template, self.tool_prompt.native)
        self.reasoning_parser = reasoning_parser_for(args.reasoning_parser, template)
        if self.reasoning_parser is None and self.tool_parser in ("harmony", "gpt-oss"):
            # harmony's channels are the whole output format: unparsed, every answer would
            # arrive wrapped in <|channel|> markup, so its parser reads every response.
            self.reasoning_parser = "harmony"
        self._kept_ids: dict[tuple[str | None, str | None], tuple[int, ...]] = {}

    @functools.cached_property
    def tool_prompt(self) -> ToolPrompt:
        """How tools reach this model's chat template (probed once; see loader/tool_prompt)."""
        if getattr(self.tokenizer, "chat_template", None) is None:
            return ToolPrompt()  # no template to probe: it is trusted, as before

        def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
            return str(self.tokenizer.apply_chat_template(messages, tools=tools))

        return ToolPrompt.probe(render)

    @property
    def injects_tools(self) -> bool:
        """The server writes the tools and the tool history into the prompt (chat_text)."""
        return self.tool_parser == "generic"

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """An upper bound on the characters one token stands for: the longest token's raw
        spelling (bytes or byte-level characters, never fewer than the text it decodes to)."""
        pieces = self.tokenizer.convert_ids_to_tokens(range(self.vocab))
        return max((len(p) for p in pieces if p), default=1)

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on the tokens `text` takes in any tokenization: no token covers more
        characters than the longest one, with a factor of 2 for normalizers that compose
        characters (NFC joins a letter and its accent)."""
        return len(text) // (2 * self.longest_token_chars)

    @functools.cached_property
    def prompt_lead(self) -> list[int]:
        """The ids the tokenizer's rule puts before a prompt's text (its BOS, or none), for
        prompts built from ids (FIM): the tokens of a probe's encode_prompt before its text."""
        body = list(self.tokenizer.encode(LEAD_PROBE, False))
        ids = list(self.tokenizer.encode_prompt(LEAD_PROBE))
        for start in range(len(ids) - len(body) + 1):
            if ids[start : start + len(body)] == body:
                return ids[:start]
        return []

    @property
    def limits(self) -> RequestLimits:
        assert self.client.model_info is not None, "the engine has not loaded yet"
        return RequestLimits.of(self.client.model_info)

    @property
    def context_length(self) -> int:
        return self.limits.context_length

    @property
    def vocab(self) -> int:
        return self.limits.vocab_size

    def check_ready(self) -> None:
        if not self.client.alive:
            raise APIError(503, self.client.dead_message or "the engine is not ready yet")

    def new_rid(self) -> str:
        # Unguessable: ids name stored Responses (GET/DELETE /v1/responses/{id}), so a caller
        # must not reach another's by counting.
        return secrets.token_hex(12)

    def check_prompt(self, ids: Sequence[int], param: str) -> None:
        """Reject prompts the engine could not take (a 400 naming `param`; both lengths in the
        message). The in-process Engine checks the same limits, worded the same."""
        problem = self.limits.prompt_problem(ids)
        if problem is not None:
            raise APIError(400, problem.message, param=param, code=problem.code)

    def submit(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        pins: tuple[CachePin, ...] = (),
        require_cached_tokens: int = 0,
        embed: Embed | None = None,
        constraint_param: str | None = None,
        output: ChatOutputSpec | None = None,
    ) -> Job:
        """Send `len(prompts) * n` engine requests (each pinning `pins` of its prompt once it is
        cached; embedding ones with `embed`); 503 if the engine is gone, 429 when full.
        `require_cached_tokens`: see GenerateRequest (the engine fails it PREFIX_EVICTED);
        `constraint_param` names the parameter a constraint came from (a compile error is a 400
        naming it); `output`: how a chat job's outputs are parsed."""
        self.check_ready()
        info = self.client.loaded
        if embed is None and info.pooling is not None:
            raise APIError(
                400,
                f"'{info.name}' is an embedding model: it cannot generate text; ask "
                "/v1/embeddings (or Ollama's /api/embed) for its vectors",
                param="model",
            )
        count = len(prompts) * params.n
        if count > self.capacity:  # more than the server ever holds: retrying cannot help
            raise APIError(
                400,
                f"this request needs {count} sequences ({len(prompts)} prompt(s) x n={params.n}), "
                f"more than the server ever runs or queues ({self.capacity}: "
                "--max-running-requests + --max-queued-requests); lower n or send fewer prompts",
                param="n" if params.n > 1 else "prompt",
            )
        if self.in_flight + count > self.capacity:
            raise APIError(
                429,
                f"the server is at capacity ({self.in_flight} requests running or queued, "
                f"limit {self.capacity}); retry shortly",
                code="rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        job = Job(self, self.new_rid(), prompts, params, embed, constraint_param, output, pins)
        requests = job.tracker.engine_requests(pins, require_cached_tokens)
        self.client.send(requests)  # no output arrives before we yield
        for choice in job.choices:
            self.client.listeners[choice.rid] = job._listener(choice)
        self.in_flight += len(job.choices)
        return job

    def kept_special_ids(
        self, tool_parser: str | None, reasoning_parser: str | None
    ) -> tuple[int, ...]:
        """The special tokens these output parsers read as text (their markers): the
        detokenizer keeps them even with skip_special_tokens. A marker that is no single
        special token of this vocabulary is text already and needs nothing."""
        key = (tool_parser, reasoning_parser)
        if key not in self._kept_ids:
            markers = special_markers(tool_parser, reasoning_parser)
            self._kept_ids[key] = tuple(
                i for m in markers if (i := self._special_id(m)) is not None
            )
        return self._kept_ids[key]

    def _special_id(self, marker: str) -> int | None:
        token_id = self.tokenizer.token_to_id(marker)
        if token_id is None or self.tokenizer.decode([token_id], skip_special_tokens=True):
            return None  # not one token, or one that decoding shows anyway
        return int(token_id)

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text
