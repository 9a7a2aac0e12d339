"""The engine loop: admit waiting requests against the radix cache, batch, run, sample, cache.

One `step()` launches at most one batch: a prefill (extend) batch when one can be admitted —
prefill has priority — otherwise a decode batch of every running request. KV bookkeeping moves
at launch; tokens are read afterwards. With a runner that overlaps (`ModelRunner.overlaps`) the
tokens of step N are read only after step N+1 is launched, so the host schedules while the
device computes: a request whose last token is still on the device is fed the runner's
placeholder for it, and one that finished in step N may run one extra step whose token is
dropped. Requests that need their tokens on the host to build the next step (grammar masks,
penalties) make the scheduler read the step in flight first. Numpy only; the model runner behind
`ModelRunner` does the array work.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from localradix.config import ServerArgs
from localradix.constrained.backend import GrammarBackend
from localradix.mem.invariants import check_invariants
from localradix.mem.kv_pool import KVPool, ReqToTokenPool
from localradix.mem.radix_cache import RadixCache
from localradix.messages import EngineStats, GenerateRequest, RequestOutput, TokenLogprob
from localradix.runner.base import LaunchedStep, ModelRunner
from localradix.sched.policy import PrefillBudget, order_waiting
from localradix.sched.request import Req, ReqState
from localradix.sched.throughput import ThroughputMeter
from localradix.step import ForwardBatch, SampleOutput, SamplingBatch

logger = logging.getLogger("localradix.scheduler")

MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # decode steps for the ratio to decay from init to min
# A request that found less than half its prompt cached is likely a one-off: its prefix is
# cached "cold", and cold prefixes beyond an eighth of --max-cached-tokens go first (a chat's
# history, reused turn after turn, stays; a stream of unrelated prompts does not pile up).
COLD_HIT_RATIO = 2
COLD_SHARE = 8
PREFIXES_REFRESH_S = 1.0  # the stats' prefix ranking walks the whole tree: at most once a second


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
        return any(r.grammar is not None or _penalized(r) for r in self.reqs)


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner,
        args: ServerArgs,
        *,
        context_len: int,
        eos_token_ids: Sequence[int],
        decode: Callable[[list[int]], str],
        vocab_size: int,
        grammar: GrammarBackend | None = None,
    ) -> None:
        self.runner = runner
        self.args = args
        self.context_len = context_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.decode = decode
        self.vocab_size = vocab_size
        self.grammar = grammar
        self.page = args.page_size
        self.pool = KVPool(runner.kv_capacity, page_size=self.page)
        # Rows reach past the context by up to a page: a request reserves its open page whole.
        row_width = self._round_up(context_len + 1) + self.page
        self.req_pool = ReqToTokenPool(args.max_running_requests + 2, row_width)
        self.cache = RadixCache(
            self.pool,
            page_size=args.page_size,
            eviction_policy=args.eviction_policy,
            disable=args.disable_radix_cache,
        )
        runner.bind_kv(self.pool, self.cache.evict)
        self.cached_budget = (
            runner.idle_cache_budget if args.max_cached_tokens is None else args.max_cached_tokens
        )
        self.waiting: list[Req] = []
        self.compiling: list[Req] = []  # waiting for their constraint's grammar
        self.running: list[Req] = []
        self.chunked: Req | None = None
        self.in_flight: InFlight | None = None
        self.overlap = runner.overlaps
        self.mixed = args.mixed_prefill == "on" or (
            args.mixed_prefill == "auto" and runner.mixes_decode_into_prefill
        )
        self._last_read = 0.0  # when the host last read a step's tokens (step timing)
        self.reqs: dict[str, Req] = {}
        self._rejected: list[RequestOutput] = []
        self._touched: dict[str, Req] = {}
        self.new_token_ratio = args.new_token_ratio
        self.retractions = 0
        self.prompt_tokens_total = 0
        self.generated_tokens_total = 0
        self.prefill_meter = ThroughputMeter()
        self.decode_meter = ThroughputMeter()
        self._decode_steps = 0
        self.recent_misses: deque[dict] = deque(maxlen=16)
        self._prefixes: tuple[dict, ...] = ()
        self._prefixes_at = -PREFIXES_REFRESH_S
        self._rng = np.random.default_rng()

    # ---- requests in and out -------------------------------------------------------------

    def add_request(self, msg: GenerateRequest) -> None:
        req = Req(
            rid=msg.rid,
            prompt_ids=np.asarray(msg.input_ids, dtype=np.int64),
            params=msg.params,
            extra_key=msg.extra_key,
        )
        error = self._reject_reason(req)
        if error is not None:
            self._rejected.append(RequestOutput(msg.rid, (), True, "error", error=error))
            return
        room = self.context_len - len(req.prompt_ids)
        if req.params.max_new_tokens > room:
            req.params = req.params.replace(max_new_tokens=room)
        self.reqs[req.rid] = req
        self.prompt_tokens_total += len(req.prompt_ids)
        if req.params.max_new_tokens == 0:
            req.finish("length")
            self._touched[req.rid] = req
            return
        if req.params.constraint is not None:
            assert self.grammar is not None  # checked by _reject_reason
            req.grammar_future = self.grammar.submit(req.params.constraint)
            self.compiling.append(req)
            return
        self.waiting.append(req)

    def _reject_reason(self, req: Req) -> str | None:
        n = len(req.prompt_ids)
        if req.rid in self.reqs:
            return f"request id {req.rid!r} is already in use"
        if n == 0:
            return "the prompt is empty"
        if n >= self.context_len:
            return (
                f"the prompt has {n} tokens but the model's context length is "
                f"{self.context_len}; shorten the prompt"
            )
        if n + 1 > self.pool.total:
            return (
                f"the prompt has {n} tokens but the KV cache holds only {self.pool.total}; "
                "raise --max-total-tokens or shorten the prompt"
            )
        if int(req.prompt_ids.min()) < 0 or int(req.prompt_ids.max()) >= self.vocab_size:
            return f"token ids must be in [0, {self.vocab_size})"
        if req.params.constraint is not None and self.grammar is None:
            return "constrained decoding is not available: pip install xgrammar"
        return None

    def abort(self, rid: str) -> None:
        req = self.reqs.get(rid)
        if req is None or req.finished:
            return
        req.finish("abort")
        if req in self.compiling:
            self.compiling.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if req is self.chunked:
            self.chunked = None
        self._release(req)
        self._touched[rid] = req

    def has_work(self) -> bool:
        return not self.idle or bool(self._touched or self._rejected)

    @property
    def idle(self) -> bool:
        return not (
            self.waiting or self.running or self.chunked or self.compiling or self.in_flight
        )

    # ---- the loop ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Launch one batch (if any) and return every request's new tokens read since the last
        step: this step's own, or with overlap, the previous step's."""
        was_busy = not self.idle
        if self.compiling:
            self._collect_grammars()
        if self.in_flight is not None and self.in_flight.needs_host_tokens:
            self._read_in_flight()
        batch = self._schedule_prefill()
        batch = batch + self._schedule_mixed_decode() if batch else self._schedule_decode()
        if batch:
            self._trim_cache()
        launched = self._launch(batch) if batch else None
        self._read_in_flight()  # step N's tokens, read while step N+1 runs
        self.in_flight = launched
        if not self.overlap:
            self._read_in_flight()
        if was_busy and self.idle:
            self.check_invariants(idle=True)
        return self._collect_outputs()

    def _trim_cache(self) -> None:
        """Evict least recently used cached prefixes beyond the budget (--max-cached-tokens):
        first the cold ones (one-off prompts) beyond an eighth of it, then any beyond it. Only
        in a step that runs something, after admission and before the launch: the new tokens'
        KV can then take the freed room (llama.cpp's cells), and an idle engine keeps the last
        conversation whole for its next turn."""
        budget = self.cached_budget
        if budget is None:
            return
        cold = self.cache.evictable_cold_size
        if cold > budget // COLD_SHARE:
            self.cache.evict(cold - budget // COLD_SHARE, cold_only=True)
        cached = self.cache.evictable_size
        if cached > budget:
            self.cache.evict(cached - budget)

    def check_invariants(self, idle: bool = False) -> None:
        owned = [self._owned_slots(r) for r in self._holders()]
        check_invariants(self.pool, self.cache, idle=idle, owned=owned)
        self.runner.check_kv(self.pool)

    def _owned_slots(self, req: Req) -> np.ndarray:
        """Slots the request (not the tree) owns: past its cached prefix, up to its page end."""
        assert req.row is not None
        return self.req_pool.table[req.row, req.cached_len : self._round_up(req.kv_len)]

    def _round_up(self, n: int) -> int:
        return -(-n // self.page) * self.page

    def _holders(self) -> list[Req]:
        held = [r for r in self.running]
        if self.chunked is not None:
            held.append(self.chunked)
        return held

    def _collect_grammars(self) -> None:
        """Move requests whose grammar finished compiling to the queue (or fail them)."""
        assert self.grammar is not None
        still = []
        for req in self.compiling:
            future = req.grammar_future
            if not future.done():
                still.append(req)
            elif future.exception() is not None:
                req.fail(str(future.exception()))
                self.reqs.pop(req.rid, None)
                self._touched[req.rid] = req
            else:
                req.grammar = self.grammar.new_state(future.result())
                self.waiting.append(req)
        self.compiling = still

    # ---- admission -----------------------------------------------------------------------

    def _match(self, req: Req) -> None:
        req.prefix_match = self.cache.match_prefix(req.all_ids, extra_key=req.extra_key)

    def _schedule_prefill(self) -> list[Req]:
        if self.chunked is None and (
            not self.waiting or len(self.running) >= self.args.max_running_requests
        ):
            return []
        ratio = self.new_token_ratio
        reserved = sum(r.remaining_new_tokens * ratio for r in self.running)
        budget = PrefillBudget(
            available=self.pool.available + self.cache.evictable_size,
            reserved=reserved,
            max_prefill_tokens=self.args.max_prefill_tokens,
            chunk_size=self.args.chunked_prefill_size,
            new_token_ratio=ratio,
        )
        if self.chunked is not None and not self._admit_chunk_continuation(budget):
            return []
        ordered = order_waiting(self.waiting, self.args.schedule_policy, self._match)
        for req in ordered:
            if len(self.running) + len(budget.admitted) >= self.args.max_running_requests:
                break
            verdict = self._try_admit(req, budget)
            if verdict == "stop":
                break
        admitted = set(map(id, budget.admitted))
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        if budget.admitted:
            self._log_prefill(budget.admitted)
        return budget.admitted

    def _admit_chunk_continuation(self, budget: PrefillBudget) -> bool:
        req = self.chunked
        assert req is not None
        key = req.all_ids
        todo = len(key) - req.kv_len
        extend = budget.extend_size(req, todo) or min(todo, max(budget.chunk_size, 1))
        extend = self._align_chunk(extend, todo) or min(todo, self.page)
        if not self._reserve(req, extend):
            return False
        self._start_extend(req, extend)
        self.chunked = req if extend < todo else None
        budget.take(req, extend, key, finishes_prompt=extend == todo)
        return True

    def _try_admit(self, req: Req, budget: PrefillBudget) -> str:
        """Admit `req` into the batch if it fits: 'ok', 'skip' (try the next one) or 'stop'."""
        self._match(req)  # fresh: an earlier admission this step may have evicted nodes
        key = req.all_ids
        match = req.prefix_match
        # Always compute >= 1 token (for logits), and start on a page boundary.
        cached = min(match.matched_len, len(key) - 1) // self.page * self.page
        if budget.shares_new_prefix(key, cached):
            return "skip"
        todo = len(key) - cached
        extend = self._align_chunk(budget.extend_size(req, todo), todo)
        if extend == 0:
            return "stop"
        if extend < todo and self.chunked is not None:
            return "skip"  # one chunked prefill in flight at a time
        row = self.req_pool.alloc()
        if row is None:
            return "stop"
        evictable_before = self.cache.evictable_size
        self.cache.lock(match.last_node)
        req.row, req.kv_len = row, cached
        if not self._reserve(req, extend):
            self.cache.unlock(match.last_node)
            self.req_pool.free(row)
            req.row, req.kv_len = None, 0
            return "stop"
        budget.room -= evictable_before - self.cache.evictable_size
        req.last_node, req.cached_len = match.last_node, cached
        self.req_pool.table[row, :cached] = match.indices[:cached]
        self._start_extend(req, extend)
        if req.cached_tokens < 0:
            req.cached_tokens = cached
            self.cache.record_hit(cached, len(req.prompt_ids) - cached)
            self._note_miss(req, match)
        if extend < todo:
            self.chunked = req
        budget.take(req, extend, key, finishes_prompt=extend == todo)
        return "ok"

    def _align_chunk(self, extend: int, todo: int) -> int:
        """A chunk that stops short of the prompt's end must end on a page boundary."""
        return extend if extend >= todo else extend // self.page * self.page

    def _reserve(self, req: Req, n: int) -> bool:
        """Map positions [kv_len, kv_len + n) to slots: the rest of the request's open page,
        then whole new pages (their unused tail stays reserved in the table row)."""
        assert req.row is not None
        start, open_end = req.kv_len, self._round_up(req.kv_len)
        need = n - min(open_end - start, n)
        if need == 0:
            return True
        slots = self.pool.alloc(self._round_up(need))
        if slots is None:
            return False
        self.req_pool.table[req.row, open_end : open_end + len(slots)] = slots
        return True

    def _start_extend(self, req: Req, extend: int) -> None:
        req.extend_len = extend
        req.state = ReqState.PREFILL

    # ---- decode and retraction -----------------------------------------------------------

    def _schedule_decode(self) -> list[Req]:
        batch = self._decodable()
        while batch and self.pool.available + self.cache.evictable_size < self._decode_need(batch):
            self._retract_one()
            batch = self._decodable()
        if not batch:
            return []
        opened = self._open_decode_pages(batch)
        assert opened, "decode room was checked just above"
        for req in batch:
            req.extend_len = 1
        step = (self.args.new_token_ratio - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = max(self.new_token_ratio - step, MIN_NEW_TOKEN_RATIO)
        return batch

    def _schedule_mixed_decode(self) -> list[Req]:
        """With --mixed-prefill, the running requests decode in the prefill's step too, if
        their slots fit without retracting anyone (else they wait, as without mixing)."""
        if not self.mixed:
            return []
        batch = self._decodable()
        if not batch or not self._open_decode_pages(batch):
            return []
        for req in batch:
            req.extend_len = 1
        return batch

    def _open_decode_pages(self, batch: list[Req]) -> bool:
        """Give each request whose page is full a new page; False (nothing taken) if short."""
        opening = [r for r in batch if r.kv_len % self.page == 0]
        slots = self.pool.alloc(len(opening) * self.page)
        if slots is None:
            return False
        for i, req in enumerate(opening):
            assert req.row is not None
            page = slots[i * self.page : (i + 1) * self.page]
            self.req_pool.table[req.row, req.kv_len : req.kv_len + self.page] = page
        return True

    def _decodable(self) -> list[Req]:
        """Running requests not already certain to stop at a token still on the device."""
        return [
            r
            for r in self.running
            if r.remaining_new_tokens > 0 and r.seq_len + r.pending < self.context_len
        ]

    def _decode_need(self, batch: list[Req]) -> int:
        """Slots one decode step must allocate: a page for each request whose page is full."""
        return sum(r.kv_len % self.page == 0 for r in batch) * self.page

    def _retract_one(self) -> None:
        """Send the request with the fewest generated tokens back to the queue, prefix cached."""
        if len(self.running) == 1:  # nothing left to retract: stop it where the pool ends
            req = self.running.pop()
            logger.warning("KV cache full (%d tokens): %s stops early", self.pool.total, req.rid)
            req.finish("length")
            self._release(req)
            self._touched[req.rid] = req
            return
        victim = min(self.running, key=lambda r: (len(r.output_ids), -len(r.prompt_ids)))
        self.running.remove(victim)
        self._release(victim)
        victim.state = ReqState.WAITING
        victim.prefix_match = None
        victim.pending, victim.epoch = 0, victim.epoch + 1  # its token in flight is dropped
        victim.retractions += 1
        self.waiting.insert(0, victim)
        self.retractions += 1
        self.new_token_ratio = self.args.new_token_ratio
        logger.info("Retracted %s (KV full); #running: %d", victim.rid, len(self.running))

    # ---- running a batch -----------------------------------------------------------------

    def _launch(self, batch: list[Req]) -> InFlight:
        """Hand the batch to the runner and move its KV bookkeeping past it."""
        fb = self._forward_batch(batch)
        sb = SamplingBatch.build(
            [r.params for r in batch],
            self._uniforms(batch),
            [self._history(r) for r in batch],
            self._vocab_mask(batch),
        )
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
            self._cache_unfinished(req)
            if req.kv_len < req.seq_len:  # a chunk of a longer prefill: no token yet
                return False
            req.state = ReqState.DECODE
            self.running.append(req)
        req.pending += 1
        if placeholders is not None:
            req.placeholder = int(placeholders[i])
        return True

    def _read_in_flight(self) -> None:
        """Read the launched step's tokens (waiting for the device if needed) and apply them."""
        step, self.in_flight = self.in_flight, None
        if step is None:
            return
        out = step.handle.result()
        now = time.monotonic()
        meter = self.prefill_meter if step.is_prefill else self.decode_meter
        meter.add(step.num_tokens, now - max(step.started, self._last_read))
        self._last_read = now
        for i, req in enumerate(step.reqs):
            # Dropped: a retracted request's token (it re-runs), or one after the request ended.
            if step.samples[i] and req.epoch == step.epochs[i] and not req.finished:
                self._take_token(req, out, i)
        if not step.is_prefill:
            self._decode_steps += 1
            if self._decode_steps % max(self.args.decode_log_interval, 1) == 0:
                self._log_decode()

    def _forward_batch(self, batch: list[Req]) -> ForwardBatch:
        ids, tables, prefixes, rows = [], [], [], []
        for req in batch:
            assert req.row is not None
            end = req.kv_len + req.extend_len
            if req.state == ReqState.PREFILL:
                ids.append(req.all_ids[req.kv_len : end])
            elif req.pending:  # its last token is still on the device
                ids.append(np.array([req.placeholder], dtype=np.int64))
            else:
                ids.append(np.array(req.output_ids[-1:], dtype=np.int64))
            tables.append(self.req_pool.table[req.row, :end])
            prefixes.append(req.kv_len)
            rows.append(req.row)
        return ForwardBatch.build(ids, tables, prefixes, rows)

    def _uniforms(self, batch: list[Req]) -> np.ndarray:
        """One draw per request; a seeded request's draw depends only on (seed, token index)."""
        draws = self._rng.random(len(batch))
        for i, req in enumerate(batch):
            if req.params.seed is not None:
                seq = [req.params.seed & 0xFFFFFFFF, len(req.output_ids) + req.pending]
                draws[i] = np.random.default_rng(seq).random()
        return draws

    def _vocab_mask(self, batch: list[Req]) -> np.ndarray | None:
        """Grammar bitmask rows for constrained requests that sample this step; None if none."""
        rows = [
            i
            for i, r in enumerate(batch)
            if r.grammar is not None and r.kv_len + r.extend_len >= r.seq_len
        ]
        if not rows:
            return None
        mask = np.full((len(batch), (self.vocab_size + 31) // 32), -1, dtype=np.int32)
        for i in rows:
            batch[i].grammar.fill_mask(mask, i)
        return mask

    @staticmethod
    def _history(req: Req) -> tuple[np.ndarray, int] | None:
        return (req.all_ids, len(req.prompt_ids)) if _penalized(req) else None

    def _take_token(self, req: Req, out: SampleOutput, i: int) -> None:
        req.pending -= 1
        token = int(out.token_ids[i])
        req.output_ids.append(token)
        self.generated_tokens_total += 1
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        if req.params.logprobs is not None and out.logprobs is not None:
            req.logprobs.append(_token_logprob(out, i, token, req.params.logprobs))
        self._touched[req.rid] = req
        self._check_finished(req, token)
        if req.finished:
            self.running.remove(req)
            self._release(req)

    def _check_finished(self, req: Req, token: int) -> None:
        p = req.params
        if token in p.stop_token_ids:
            req.finish("stop", token)
        elif token in self.eos_token_ids and not p.ignore_eos:
            req.finish("stop", token)
        elif req.grammar is not None and not req.grammar.accept(token):
            req.fail(f"token {token} broke the request's grammar")
        elif req.grammar is not None and req.grammar.terminated:
            req.finish("stop", token)
        elif len(req.output_ids) >= p.max_new_tokens or req.seq_len >= self.context_len:
            req.finish("length")
        elif p.stop:
            window = max(len(s) for s in p.stop) + 1
            tail = self.decode(req.output_ids[-window:])
            for s in p.stop:
                if s in tail:
                    req.finish("stop", s)
                    break

    # ---- handing KV to the radix cache ---------------------------------------------------

    def _cache_unfinished(self, req: Req) -> None:
        """Insert the computed prefix into the tree so others can share it; move our lock."""
        if self.cache.disable:
            return
        assert req.row is not None
        slots = self.req_pool.table[req.row, : req.kv_len]
        ids = req.all_ids[: req.kv_len]
        already = self.cache.insert(ids, slots.copy(), req.extra_key, cold=self._is_one_off(req))
        self.pool.free(slots[req.cached_len : already])
        match = self.cache.match_prefix(ids, extra_key=req.extra_key, count_hit=False)
        self.req_pool.table[req.row, : match.matched_len] = match.indices
        self.cache.lock(match.last_node)
        self.cache.unlock(req.last_node)
        req.last_node, req.cached_len = match.last_node, match.matched_len

    @staticmethod
    def _is_one_off(req: Req) -> bool:
        """Less than half the prompt was cached: its prefix is cached cold (see COLD_SHARE)."""
        return req.cached_tokens * COLD_HIT_RATIO < len(req.prompt_ids)

    def _release(self, req: Req) -> None:
        """Give a leaving request's KV to the tree (cached, evictable) and free its row."""
        if req.row is None:
            return
        slots = self.req_pool.table[req.row, : self._round_up(req.kv_len)].copy()
        if self.cache.disable:
            self.pool.free(slots)
        else:
            whole = req.kv_len // self.page * self.page  # the tree keeps whole pages only
            cold = self._is_one_off(req)
            already = self.cache.insert(
                req.all_ids[:whole], slots[:whole], req.extra_key, cold=cold
            )
            self.pool.free(slots[req.cached_len : already])
            self.pool.free(slots[whole:])  # the open page, reserved tail included
            self.cache.unlock(req.last_node)
        self.req_pool.free(req.row)
        req.row, req.last_node, req.cached_len, req.kv_len = None, None, 0, 0

    # ---- outputs, stats, logs ------------------------------------------------------------

    def _collect_outputs(self) -> list[RequestOutput]:
        outputs, self._rejected = self._rejected, []
        for req in self._touched.values():
            outputs.append(self._output(req))
            if req.finished:
                self.reqs.pop(req.rid, None)
        self._touched = {}
        return outputs

    @staticmethod
    def _output(req: Req) -> RequestOutput:
        new = tuple(req.output_ids[req.sent_tokens :])
        logprobs = tuple(req.logprobs[req.sent_logprobs :])
        req.sent_tokens, req.sent_logprobs = len(req.output_ids), len(req.logprobs)
        return RequestOutput(
            rid=req.rid,
            new_token_ids=new,
            finished=req.finished,
            finish_reason=req.finish_reason,
            matched_stop=req.matched_stop,
            prompt_tokens=len(req.prompt_ids),
            cached_tokens=max(req.cached_tokens, 0),
            completion_tokens=len(req.output_ids),
            logprobs=logprobs,
            error=req.error,
        )

    def _note_miss(self, req: Req, match: Any) -> None:
        """Remember where a new prompt left the cached path (the TUI explains misses)."""
        div = match.divergence
        if div is None or match.matched_len >= len(req.prompt_ids) - 1:
            return
        at = int(div.position)
        ids = req.prompt_ids
        self.recent_misses.append(
            {
                "rid": req.rid,
                "prompt_tokens": len(ids),
                "matched_tokens": match.matched_len,
                "reason": div.reason,
                "position": at,
                "cached_text": ""
                if div.cached_token is None
                else self._preview([div.cached_token]),
                "request_text": self._preview(ids[at : at + 6].tolist()),
                "before_text": self._preview(ids[max(at - 6, 0) : at].tolist()),
            }
        )

    def _preview(self, ids: list[int]) -> str:
        try:
            return self.decode([int(t) for t in ids if t is not None])[:80]
        except Exception:  # a preview is never worth failing a step
            return ""

    def kv_usage(self) -> float:
        return self.cache.protected_size / max(self.pool.total, 1)

    def stats(self) -> EngineStats:
        now = time.monotonic()
        return EngineStats(
            running=len(self.running) + (self.chunked is not None),
            queued=len(self.waiting),
            kv_total=self.pool.total,
            kv_used=self.cache.protected_size
            + sum(len(self._owned_slots(r)) for r in self._holders()),
            kv_cached=self.cache.evictable_size,
            kv_free=self.pool.available,
            cache_hit_tokens=self.cache.hit_tokens,
            cache_miss_tokens=self.cache.miss_tokens,
            prompt_tokens_total=self.prompt_tokens_total,
            generated_tokens_total=self.generated_tokens_total,
            retractions=self.retractions,
            prefill_tokens_per_s=self.prefill_meter.rate(now),
            decode_tokens_per_s=self.decode_meter.rate(now),
            requests=tuple(_req_row(r, now) for r in self._holders() + self.waiting[:32]),
            top_prefixes=self._top_prefixes(now),
            recent_misses=tuple(self.recent_misses),
        )

    def _top_prefixes(self, now: float) -> tuple[dict, ...]:
        """The tree's best prefixes, recomputed at most once a second (it walks every node)."""
        if now - self._prefixes_at >= PREFIXES_REFRESH_S:
            rows = self.cache.top_prefixes(8)
            for row in rows:
                row["preview"] = self._preview(row["head"])
            self._prefixes, self._prefixes_at = tuple(rows), now
        return self._prefixes

    def _log_prefill(self, admitted: list[Req]) -> None:
        logger.info(
            "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, KV usage: %.2f, "
            "#running: %d, #queue: %d",
            len(admitted),
            sum(r.extend_len for r in admitted),
            sum(r.kv_len for r in admitted),
            self.kv_usage(),
            len(self.running),
            len(self.waiting),
        )

    def _log_decode(self) -> None:
        logger.info(
            "Decode batch. #running: %d, KV usage: %.2f, gen throughput (token/s): %.1f, "
            "#queue: %d",
            len(self.running),
            self.kv_usage(),
            self.decode_meter.rate(time.monotonic()),
            len(self.waiting),
        )


def _penalized(req: Req) -> bool:
    p = req.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0 or p.frequency_penalty != 0


def _token_logprob(out: SampleOutput, i: int, token: int, k: int) -> TokenLogprob:
    assert out.logprobs is not None
    top: tuple[tuple[int, float], ...] = ()
    if k > 0 and out.top_ids is not None and out.top_logprobs is not None:
        top = tuple(
            (int(t), float(lp)) for t, lp in zip(out.top_ids[i, :k], out.top_logprobs[i, :k])
        )
    return TokenLogprob(token, float(out.logprobs[i]), top)


def _req_row(req: Req, now: float) -> dict:
    ttft = None if req.first_token_time is None else req.first_token_time - req.arrival_time
    return {
        "id": req.rid,
        "state": req.state.value,
        "prompt_tokens": len(req.prompt_ids),
        "cached_tokens": max(req.cached_tokens, 0),
        "generated_tokens": len(req.output_ids),
        "ttft_s": ttft,
        "age_s": now - req.arrival_time,
        "retractions": req.retractions,
    }
