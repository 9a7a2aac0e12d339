"""Requests in and out of the queues: add (checked against the model's limits), abort, and
move constrained requests to the queue once their grammar has compiled."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from localradix.constrained.backend import GrammarBackend
from localradix.constrained.grammar import InvalidGrammar
from localradix.limits import RequestLimits
from localradix.messages import ErrorCode, GenerateRequest, RequestOutput
from localradix.sched.queues import RequestQueues
from localradix.sched.request import Ask, PinsDue, Req
from localradix.sched.slot_handoff import SlotHandoff
from localradix.sched.stats import SchedulerStats


@dataclass(eq=False)
class Intake:
    queues: RequestQueues
    slots: SlotHandoff
    stats: SchedulerStats
    context_len: int
    vocab_size: int
    grammar: GrammarBackend | None
    embeds: bool = False  # the runner pools hidden states (embedding requests)

    def add(self, msg: GenerateRequest) -> None:
        """Queue a new request (or report why not); clamp its max_new_tokens to the context."""
        q = self.queues
        ask = Ask(
            rid=msg.rid,
            prompt_ids=np.asarray(msg.input_ids, dtype=np.int64),
            params=msg.params,
            extra_key=msg.extra_key,
            require_cached_tokens=msg.require_cached_tokens,
            embed=msg.embed,
        )
        error = self._reject_reason(ask)
        if error is not None:
            rejected = RequestOutput(
                msg.rid, (), True, "error", error=error, error_code=ErrorCode.INVALID_REQUEST
            )
            q.rejected.append(rejected)
            return
        room = self.context_len - len(ask.prompt_ids)
        if ask.params.max_new_tokens > room:
            ask = dataclasses.replace(ask, params=ask.params.replace(max_new_tokens=room))
        req = Req(ask, PinsDue(msg.pins))
        q.by_rid[req.ask.rid] = req
        self.stats.prompt_tokens_total += len(req.ask.prompt_ids)
        if req.ask.params.max_new_tokens == 0:
            req.finish("length")
            q.touch(req)
            return
        if req.ask.params.constraint is not None:
            assert self.grammar is not None  # checked by _reject_reason
            req.constraint.future = self.grammar.submit(req.ask.params.constraint)
            q.compiling.append(req)
            return
        q.waiting.append(req)

    def _reject_reason(self, ask: Ask) -> str | None:
        n = len(ask.prompt_ids)
        if ask.rid in self.queues.by_rid:
            return f"request id {ask.rid!r} is already in use"
        limits = RequestLimits(self.context_len, self.slots.pool.total, self.vocab_size)
        problem = limits.prompt_problem(ask.prompt_ids.tolist())
        if problem is not None:  # the front ends checked with the same words; this is the last line
            return problem.message
        if not 0 <= ask.require_cached_tokens <= n:
            return f"require_cached_tokens must be in [0, {n}] (the prompt's length)"
        if ask.embed is not None and not self.embeds:
            return "this backend cannot embed; serve the model with the torch or MLX backend"
        if ask.embed is not None and ask.embed.pooling not in ("last", "mean"):
            return f"unknown pooling {ask.embed.pooling!r}: use 'last' or 'mean'"
        if ask.params.constraint is not None and self.grammar is None:
            return "constrained decoding is not available: pip install xgrammar"
        return None

    def abort(self, rid: str) -> None:
        """Finish a live request as aborted and give its KV back (a no-op once it is done)."""
        req = self.queues.by_rid.get(rid)
        if req is None or req.finished:
            return
        req.finish("abort")
        self.queues.remove(req)
        self.slots.release(req)
        self.queues.touch(req)

    def collect_grammars(self) -> None:
        """Move requests whose grammar finished compiling to the queue (or fail them)."""
        assert self.grammar is not None
        q, still = self.queues, []
        for req in q.compiling:
            future = req.constraint.future
            assert future is not None  # set when it joined `compiling`
            if not future.done():
                still.append(req)
            elif (error := future.exception()) is not None:
                bad = isinstance(error, InvalidGrammar)  # the user's constraint, or our compiler
                req.fail(
                    str(error), ErrorCode.INVALID_CONSTRAINT if bad else ErrorCode.ENGINE_FAILURE
                )
                q.by_rid.pop(req.ask.rid, None)
                q.touch(req)
            else:
                req.constraint.grammar = self.grammar.new_state(future.result())
                q.waiting.append(req)
        q.compiling = still
