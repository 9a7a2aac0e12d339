"""Text completions rendered: every choice, streamed or whole, goes through one `choice()`
(a whole answer is one delta per choice), so echo and logprob offsets agree in both."""

from __future__ import annotations

from collections.abc import AsyncIterator

from localradix.server.core.gather import Gathered, batches
from localradix.server.core.http import sse
from localradix.server.errors import APIError
from localradix.server.openai.render import SSE_DONE, completion_logprobs, sse_error, usage
from localradix.server.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from localradix.server.tokenizer_manager import Delta, Job


class CompletionChoices:
    """Renders a job's deltas as choices: the echoed prompt goes before a choice's first text,
    and logprob text offsets count from the start of the choice's text."""

    def __init__(self, job: Job, model: str, req: CompletionRequest, prompt_texts: list[str]):
        self.job, self.model, self.req = job, model, req
        self.prompt_texts = prompt_texts
        self.echo_pending = {c.index for c in job.choices} if req.echo else set()
        self.offsets = [0] * len(job.choices)

    def wants(self, d: Delta) -> bool:
        return bool(d.text or d.logprobs or d.finish_reason or d.index in self.echo_pending)

    def choice(self, d: Delta) -> CompletionChoice:
        prefix = ""
        if d.index in self.echo_pending:
            self.echo_pending.discard(d.index)
            prefix = self.prompt_texts[d.index // self.req.n]
        lp = None
        if self.req.logprobs is not None:
            offset = self.offsets[d.index] + len(prefix)
            lp = completion_logprobs(self.job.manager, d.logprobs, offset)
        self.offsets[d.index] += len(prefix) + len(d.text)
        return CompletionChoice(d.index, prefix + d.text, lp, d.finish_reason)

    def body(
        self, choices: list[CompletionChoice], usage: Usage | None = None
    ) -> CompletionResponse:
        return CompletionResponse(
            id=f"cmpl-{self.job.rid}",
            object="text_completion",
            created=self.job.created,
            model=self.model,
            choices=choices,
            usage=usage,
        )


def completion_response(
    g: Gathered, model: str, req: CompletionRequest, prompt_texts: list[str]
) -> CompletionResponse:
    render = CompletionChoices(g.job, model, req, prompt_texts)
    return render.body([render.choice(d) for d in g.as_deltas()], usage(g.job))


async def completion_stream(
    job: Job, model: str, req: CompletionRequest, prompt_texts: list[str]
) -> AsyncIterator[bytes]:
    render = CompletionChoices(job, model, req, prompt_texts)
    try:
        async for part in batches(job):
            if isinstance(part, APIError):
                yield sse_error(part)
                return
            choices = [render.choice(d) for d in part if render.wants(d)]
            if choices:
                yield sse(render.body(choices))
        if req.stream_options is not None and req.stream_options.include_usage:
            yield sse(render.body([], usage(job)))
        yield SSE_DONE
    finally:
        job.close()
