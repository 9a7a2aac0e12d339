"""Running a batch: launch it on the runner (KV bookkeeping moves at launch), then read its
tokens (apply them, check stops, release finished requests).

With a runner that overlaps, the loop reads step N only after launching step N+1; `InFlight`
remembers what step N needs at that later read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from localradix.messages import TokenLogprob
from localradix.runner.base import LaunchedStep, ModelRunner
from localradix.sched.plan import forward_batch, penalized, sampling_batch
from localradix.sched.queues import RequestQueues
from localradix.sched.request import Req, ReqState
from localradix.sched.slot_handoff import SlotHandoff
from localradix.sched.stats import SchedulerStats
from localradix.sched.stop_check import StopChecker
from localradix.step import SampleOutput


@dataclass
class InFlight:
    """A launched step whose tokens the host has not read yet."""

    reqs: list[Req]
    epochs: list[int]  # each request's epoch at launch: a retracted request drops its token
    samples: list[bool]  # whether each request samples a token (a non-final chunk does not)
    handle: LaunchedStep
    is_prefill: bool
    num_tokens: int
    started: float

    @property
    def needs_host_tokens(self) -> bool:
        """Whether its requests' next step needs these tokens on the host (grammar, penalties)."""
        return any(r.grammar is not None or penalized(r) for r in self.reqs)


@dataclass(eq=False)
class StepLauncher:
    runner: ModelRunner
    queues: RequestQueues
    slots: SlotHandoff
    stop: StopChecker
    stats: SchedulerStats
    vocab_size: int
    _rng: np.random.Generator = field(default_factory=np.random.default_rng, init=False)

    def launch(self, batch: list[Req]) -> InFlight:
        """Hand the batch to the runner and move its KV bookkeeping past it."""
        fb = forward_batch(batch, self.slots.req_pool.table)
        sb = sampling_batch(batch, self._rng, self.vocab_size)
        is_prefill = batch[0].state == ReqState.PREFILL
        started = time.monotonic()
        handle = self.runner.launch(fb, sb)
        epochs = [r.epoch for r in batch]
        samples = [self._advance_kv(req, handle.placeholders, i) for i, req in enumerate(batch)]
        return InFlight(batch, epochs, samples, handle, is_prefill, fb.num_tokens, started)

    def _advance_kv(self, req: Req, placeholders: np.ndarray | None, i: int) -> bool:
        """KV bookkeeping at launch; True when the request samples a token in this step."""
        was_prefill = req.state == ReqState.PREFILL
        req.kv_len += req.extend_len
        req.extend_len = 0
        if was_prefill:
            self.slots.cache_unfinished(req)
            if req.kv_len < req.seq_len:  # a chunk of a longer prefill: no token yet
                return False
            req.state = ReqState.DECODE
            self.queues.running.append(req)
        req.pending += 1
        if placeholders is not None:
            req.placeholder = int(placeholders[i])
        return True

    def read(self, step: InFlight) -> None:
        """Read the launched step's tokens (waiting for the device if needed) and apply them."""
        out = step.handle.result()
        self.stats.time_step(step.is_prefill, step.num_tokens, step.started)
        for i, req in enumerate(step.reqs):
            # Dropped: a retracted request's token (it re-runs), or one after the request ended.
            if step.samples[i] and req.epoch == step.epochs[i] and not req.finished:
                self._take_token(req, out, i)
        if not step.is_prefill:
            self.stats.count_decode_step()

    def _take_token(self, req: Req, out: SampleOutput, i: int) -> None:
        req.pending -= 1
        token = int(out.token_ids[i])
        req.output_ids.append(token)
        self.stats.generated_tokens_total += 1
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        if req.params.logprobs is not None and out.logprobs is not None:
            req.logprobs.append(_token_logprob(out, i, token, req.params.logprobs))
        self.queues.touch(req)
        self.stop.check(req, token)
        if req.finished:
            self.queues.running.remove(req)
            self.slots.release(req)


def _token_logprob(out: SampleOutput, i: int, token: int, k: int) -> TokenLogprob:
    assert out.logprobs is not None
    top: tuple[tuple[int, float], ...] = ()
    if k > 0 and out.top_ids is not None and out.top_logprobs is not None:
        top = tuple(
            (int(t), float(lp)) for t, lp in zip(out.top_ids[i, :k], out.top_logprobs[i, :k])
        )
    return TokenLogprob(token, float(out.logprobs[i]), top)
