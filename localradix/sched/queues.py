"""Where every live request is, and what the next step reports back.

One object shared by the scheduler's rooms (intake, admission, decode, launch), so each room
is handed the queues explicitly instead of reaching into the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localradix.messages import RequestOutput
from localradix.sched.request import Req


@dataclass(eq=False)
class RequestQueues:
    compiling: list[Req] = field(default_factory=list)  # waiting for their constraint's grammar
    waiting: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)  # decoding
    chunked: Req | None = None  # the one prefill in flight chunk by chunk
    embedding: list[Req] = field(default_factory=list)  # last chunk launched, vector not read
    by_rid: dict[str, Req] = field(default_factory=dict)  # every request not yet reported done
    touched: dict[str, Req] = field(default_factory=dict)  # with news for the next outputs
    rejected: list[RequestOutput] = field(default_factory=list)  # refused at the door

    @property
    def busy(self) -> bool:
        return bool(
            self.waiting or self.running or self.chunked or self.compiling or self.embedding
        )

    @property
    def has_news(self) -> bool:
        return bool(self.touched or self.rejected)

    def holders(self) -> list[Req]:
        """Requests that hold KV slots: the running ones, the chunked prefill and embedding
        requests whose last chunk is in flight."""
        held = list(self.running) + list(self.embedding)
        if self.chunked is not None:
            held.append(self.chunked)
        return held

    def touch(self, req: Req) -> None:
        self.touched[req.ask.rid] = req

    def remove(self, req: Req) -> None:
        """Take `req` out of whichever queue holds it (an abort)."""
        for queue in (self.compiling, self.waiting, self.running, self.embedding):
            if req in queue:
                queue.remove(req)
        if req is self.chunked:
            self.chunked = None

    def collect_outputs(self) -> list[RequestOutput]:
        """Every touched request's news since it was last reported; finished ones are forgotten."""
        outputs, self.rejected = self.rejected, []
        for req in self.touched.values():
            outputs.append(_output(req))
            if req.finished:
                self.by_rid.pop(req.ask.rid, None)
        self.touched = {}
        return outputs


def _output(req: Req) -> RequestOutput:
    new = tuple(req.progress.output_ids[req.report.sent_tokens :])
    logprobs = tuple(req.progress.logprobs[req.report.sent_logprobs :])
    req.report.sent_tokens, req.report.sent_logprobs = (
        len(req.progress.output_ids),
        len(req.progress.logprobs),
    )
    return RequestOutput(
        rid=req.ask.rid,
        new_token_ids=new,
        finished=req.finished,
        finish_reason=req.outcome.finish_reason,
        matched_stop=req.outcome.matched_stop,
        prompt_tokens=len(req.ask.prompt_ids),
        cached_tokens=max(req.hold.cached_tokens, 0),
        completion_tokens=len(req.progress.output_ids),
        logprobs=logprobs,
        error=req.outcome.error,
        error_code=req.outcome.error_code,
        embedding=req.pooling.embedding,
    )
