"""A job's outputs as the dialects read them: `answer` streams them or gathers them whole;
`batches` (an error after the headers went out is yielded, not raised) feeds the streams
(parsed.py parses them); `Timing` notes when they came."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request, Response

from localradix.messages import TokenLogprob
from localradix.server.core.http import (
    SSE,
    ClosingStream,
    client_gone_response,
    closed_on_error,
    json_response,
    unless_disconnected,
)
from localradix.server.errors import APIError
from localradix.server.tokenizer_manager import Delta, Job


class Timing:
    """When a job started, produced its first token and ended (monotonic seconds)."""

    def __init__(self, job: Job) -> None:
        self.start = job.start
        self.first: float | None = None
        self.end: float | None = None

    def saw(self, batch: list[Delta]) -> None:
        if self.first is None and any(d.text or d.finish_reason for d in batch):
            self.first = time.monotonic()

    def done(self) -> None:
        self.end = time.monotonic()
        if self.first is None:
            self.first = self.end


class Gathered:
    """A finished job's text, finish reasons and logprobs per choice, and when they came."""

    def __init__(self, job: Job) -> None:
        self.job = job
        count = len(job.choices)
        self.text = [""] * count
        self.finish: list[str | None] = [None] * count
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(count)]
        self.timing = Timing(job)

    async def run(self) -> Gathered:
        async for batch in self.job.deltas():
            self.timing.saw(batch)
            for d in batch:
                self.text[d.index] += d.text
                self.logprobs[d.index].extend(d.logprobs)
                if d.finish_reason:
                    self.finish[d.index] = d.finish_reason
        self.timing.done()
        return self

    def as_deltas(self) -> list[Delta]:
        """Each choice's whole output as one delta (what a stream would have sent in sum)."""
        return [
            Delta(i, self.text[i], self.logprobs[i], self.finish[i]) for i in range(len(self.text))
        ]


async def gather(request: Request[Any, Any, Any], job: Job) -> Gathered | None:
    """The finished job, or None (and the job aborted) if the client disconnects first."""
    return await unless_disconnected(request, job, Gathered(job).run())


async def batches(job: Job, timing: Timing | None = None) -> AsyncIterator[list[Delta] | APIError]:
    """The job's batches (noted in `timing`, if given); an error after the headers went out is
    yielded (and counted), not raised."""
    try:
        async for batch in job.deltas():
            if timing is not None:
                timing.saw(batch)
            yield batch
    except APIError as exc:
        job.manager.metrics.record_error(exc.status)
        yield exc
    if timing is not None:
        timing.done()


async def answer(
    request: Request[Any, Any, Any],
    job: Job,
    stream: Callable[[], AsyncIterator[bytes]] | None,
    whole: Callable[[Gathered], Any],
    media_type: str = SSE,
) -> Response[Any]:
    """The job's answer: streamed (`stream` given) or gathered and rendered by `whole`; a job
    whose answer cannot be built is aborted."""
    with closed_on_error(job):
        if stream is not None:
            await constraint_compiled(job)
            return ClosingStream(stream(), media_type)
        gathered = await gather(request, job)
        if gathered is None:
            return client_gone_response()
        return json_response(whole(gathered))


async def constraint_compiled(job: Job) -> None:
    """Hold a constrained stream's headers until the engine's first output, so a grammar that
    does not compile is a plain 400 rather than an error inside a 200 stream."""
    if job.params.constraint is not None:
        await job.first_output()


def matched_stop(job: Job, index: int = 0) -> str | None:
    """The stop string that ended a choice, if one did (the engine's `matched_stop`)."""
    final = job.choices[index].final
    matched = None if final is None else final.matched_stop
    return matched if isinstance(matched, str) else None
