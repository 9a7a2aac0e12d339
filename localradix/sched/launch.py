"""Running a batch: launch it on the runner (KV bookkeeping moves at launch), then read its
tokens (apply them, check stops, release finished requests).

With a runner that overlaps, the loop reads step N only after launching step N+1; `InFlight`
remembers what step N needs at that later read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from localradix.messages import ErrorCode, TokenLogprob
from localradix.runner.base import LaunchedStep, ModelRunner
from localradix.sched import embedding
from localradix.sched.plan import forward_batch, penalized, verify_sampling
from localradix.sched.queues import RequestQueues
from localradix.sched.request import Req, ReqState
from localradix.sched.slot_handoff import SlotHandoff
from localradix.sched.speculation import Speculator, clear_drafts, step_work, verdict_of
from localradix.sched.stats import SchedulerStats
from localradix.sched.stop_check import StopChecker
from localradix.step import SampleOutput


@dataclass
class InFlight:
    """A launched step whose tokens the host has not read yet."""

    reqs: list[Req]
    epochs: list[int]  # each request's epoch at launch: a retracted request drops its token
    samples: list[bool]  # whether each request samples a token (a non-final chunk does not)
    drafts: list[np.ndarray]  # each request's drafts verified by this step (most: none)
    first_rows: np.ndarray  # each request's first sampled row in the step's output
    handle: LaunchedStep
    is_prefill: bool
    num_tokens: int
    started: float
    drafts_next: bool = False  # some request may draft at its next step (`drafts_next`)
    planned: float = 0.0  # when its planning began (drafting included), for the cost model
    work: tuple[int, float] | None = None  # a decode step's (rows, context read): cost model

    @property
    def needs_host_tokens(self) -> bool:
        """Whether its requests' next step needs these tokens on the host (grammar, penalties,
        drafts: the next drafts continue from the accepted ones)."""
        if self.drafts_next or any(len(d) for d in self.drafts):
            return True
        return any(r.constraint.grammar is not None or penalized(r) for r in self.reqs)


@dataclass(eq=False)
class StepLauncher:
    runner: ModelRunner
    queues: RequestQueues
    slots: SlotHandoff
    stop: StopChecker
    stats: SchedulerStats
    vocab_size: int
    speculator: Speculator | None = None  # None: never speculates (as with it disabled)
    _rng: np.random.Generator = field(default_factory=np.random.default_rng, init=False)

    def launch(self, batch: list[Req]) -> InFlight:
        """Hand the batch to the runner and move its KV bookkeeping past it."""
        planned = time.monotonic()
        if self.speculator is not None:
            self.speculator.draft(batch)
        fb = forward_batch(batch, self.slots.req_pool.table)
        sb = verify_sampling(batch, self._rng, self.vocab_size)
        is_prefill = batch[0].hold.state == ReqState.PREFILL
        work = None if is_prefill else step_work(batch)
        started = time.monotonic()
        handle = self.runner.launch(fb, sb)
        epochs = [r.progress.epoch for r in batch]
        drafts = [r.drafts.ids for r in batch]
        first_rows = fb.last_row - np.array([len(d) for d in drafts], dtype=np.int64)
        samples = [
            self._advance_kv(req, len(drafts[i]), handle.placeholders, i)
            for i, req in enumerate(batch)
        ]
        clear_drafts(batch)  # run now; verified at the read
        spec = self.speculator
        drafts_next = spec is not None and spec.drafts_next(batch)
        return InFlight(
            batch,
            epochs,
            samples,
            drafts,
            first_rows,
            handle,
            is_prefill,
            fb.num_tokens,
            started,
            drafts_next,
            planned,
            work,
        )

    def _advance_kv(self, req: Req, drafts: int, placeholders: np.ndarray | None, i: int) -> bool:
        """KV bookkeeping at launch (`drafts`: how many of its positions are drafts); True when
        the request samples a token in this step."""
        was_prefill = req.hold.state == ReqState.PREFILL
        if not self.slots.advance(req, drafts):
            return False
        if was_prefill:
            if req.ask.embed is not None:  # prefill only: it ends when this step is read
                self.queues.embedding.append(req)
                return True
            self.queues.running.append(req)
        req.progress.pending += 1
        if placeholders is not None:
            req.progress.placeholder = int(placeholders[i])
        return True

    def read(self, step: InFlight) -> None:
        """Read the launched step's tokens (waiting for the device if needed) and apply them."""
        out = step.handle.result()
        previous_read = self.stats.last_read
        self.stats.time_step(step.is_prefill, step.num_tokens, step.started)
        if self.speculator is not None and step.work is not None:
            # From planning (drafting is part of a verify's cost) or, with overlap, from the
            # previous read: the steps ran back to back.
            seconds = self.stats.last_read - max(step.planned, previous_read)
            self.speculator.observe(step.work, seconds)
        for i, req in enumerate(step.reqs):
            # Dropped: a retracted request's token (it re-runs), or one after the request ended.
            if req.progress.epoch != step.epochs[i] or req.finished:
                continue
            if req.ask.embed is not None:
                self._take_pooled(req, out, i, last_chunk=step.samples[i])
            elif step.samples[i]:
                self._take_tokens(req, out, int(step.first_rows[i]), step.drafts[i])
        if not step.is_prefill:
            self.stats.count_decode_step()

    def _take_pooled(self, req: Req, out: SampleOutput, i: int, last_chunk: bool) -> None:
        """Fold one prefill chunk's pooled state into an embedding request; after the last
        chunk it is done (finish reason "stop", no tokens) and leaves its prompt cached."""
        assert req.ask.embed is not None
        if out.pooled is None:
            req.fail(
                "the runner returned no hidden states for an embedding request",
                ErrorCode.ENGINE_FAILURE,
            )
        else:
            req.pooling.pooled = embedding.add_chunk(
                req.pooling.pooled, out.pooled[i], req.ask.embed
            )
            if not last_chunk:
                return
            req.pooling.embedding = embedding.vector(
                req.pooling.pooled, len(req.ask.prompt_ids), req.ask.embed
            )
            req.finish("stop")
        self.queues.remove(req)
        self.slots.release(req)
        self.queues.touch(req)

    def _take_tokens(self, req: Req, out: SampleOutput, row: int, drafts: np.ndarray) -> None:
        """Apply the step's tokens of one request: its sampled token, or for a verify the
        accepted drafts and the token after them, one at a time until it stops."""
        req.progress.pending -= 1
        verdict = verdict_of(drafts, out.token_ids[row : row + len(drafts) + 1])
        emitted = verdict.tokens(drafts)
        taken = 0
        while taken < len(emitted) and not req.finished:
            self._take_token(req, out, row + taken, int(emitted[taken]))
            taken += 1
        if self.speculator is not None:
            self.speculator.settle(req, drafts, verdict, taken)
        if len(drafts):
            self.stats.spec.add(len(drafts), verdict.accepted)
        if req.finished:
            self.queues.running.remove(req)
            self.slots.release(req)

    def _take_token(self, req: Req, out: SampleOutput, i: int, token: int) -> None:
        req.progress.output_ids.append(token)
        self.stats.generated_tokens_total += 1
        if req.progress.first_token_time is None:
            req.progress.first_token_time = time.monotonic()
        if req.ask.params.logprobs is not None and out.logprobs is not None:
            req.progress.logprobs.append(_token_logprob(out, i, token, req.ask.params.logprobs))
        self.queues.touch(req)
        self.stop.check(req, token)


def _token_logprob(out: SampleOutput, i: int, token: int, k: int) -> TokenLogprob:
    assert out.logprobs is not None
    top: tuple[tuple[int, float], ...] = ()
    if k > 0 and out.top_ids is not None and out.top_logprobs is not None:
        top = tuple(
            (int(t), float(lp)) for t, lp in zip(out.top_ids[i, :k], out.top_logprobs[i, :k])
        )
    return TokenLogprob(token, float(out.logprobs[i]), top)
