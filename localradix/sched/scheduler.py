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

The rooms this loop drives, one file each:
  intake.py        requests in (checked against the limits), aborts, grammars compiled
  admission.py     prefill admission: which waiting requests (or chunk) prefill this step
  decode.py        the decode batch, and retraction when KV runs out
  slot_handoff.py  KV slots between a request and the radix tree (claim, reserve, cache, release)
  pins.py          cache_control pins: applied after prefill, swept when due, within a budget
  launch.py        launch a batch on the runner; read its tokens (with plan.py: the step plan)
  stop_check.py    when a request stops (tokens, length, grammar, stop strings)
  stats.py         counters, meters, logs and the TUI's previews
  queues.py        where every request is, and the outputs of the step
  request.py       a request's typed parts, each written by one of these rooms
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import cast

from localradix.constrained.backend import GrammarBackend
from localradix.mem.invariants import check_invariants
from localradix.mem.kv_pool import KVPool, ReqToTokenPool
from localradix.mem.kv_tiers import KVTiers, StateTransfer
from localradix.mem.radix_cache import RadixCache
from localradix.mem.snapshot_store import SnapshotStore
from localradix.messages import EngineStats, GenerateRequest, RequestOutput
from localradix.runner.base import ModelRunner
from localradix.sched.admission import PrefillAdmission
from localradix.sched.cache_budget import trim_cache
from localradix.sched.decode import DecodePlanner
from localradix.sched.intake import Intake
from localradix.sched.launch import InFlight, StepLauncher
from localradix.sched.pins import PinKeeper
from localradix.sched.prefill_pace import PrefillPace
from localradix.sched.queues import RequestQueues
from localradix.sched.request import Req, ReqState
from localradix.sched.sched_config import SchedulerConfig
from localradix.sched.slot_handoff import SlotHandoff
from localradix.sched.speculation import Speculator
from localradix.sched.stats import SchedulerStats
from localradix.sched.stop_check import StopChecker

logger = logging.getLogger("localradix.scheduler")


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner,
        args: SchedulerConfig,
        *,
        context_len: int,
        eos_token_ids: Sequence[int],
        decode: Callable[[list[int]], str],
        vocab_size: int,
        grammar: GrammarBackend | None = None,
        clock: Callable[[], float] = time.monotonic,
        tiers: KVTiers | None = None,
    ) -> None:
        self.runner = runner
        self.clock = clock  # pin deadlines and when one-off prefixes turn cold
        self.args = args
        page = args.page_size
        self.pool = KVPool(runner.kv_capacity, page_size=page)
        # Rows reach past the context by up to a page: a request reserves its open page whole.
        row_width = -(-(context_len + 1) // page) * page + page
        self.req_pool = ReqToTokenPool(args.max_running_requests + 2, row_width)
        self.cache = RadixCache(
            self.pool,
            page_size=page,
            eviction_policy=args.eviction_policy,
            disable=args.disable_radix_cache,
            snapshots=self._snapshot_store(runner),
        )
        runner.bind_kv(self.pool, self.cache.evict)
        self.cached_budget = (
            runner.idle_cache_budget if args.max_cached_tokens is None else args.max_cached_tokens
        )
        self.overlap = runner.overlaps
        self.mixed = args.mixed_prefill == "on" or (
            args.mixed_prefill == "auto" and runner.mixes_decode_into_prefill
        )
        self.queues = RequestQueues()
        self.slots = SlotHandoff(self.pool, self.req_pool, self.cache, clock, runner.snapshots)
        self.tiers = self._tiers(tiers)
        self.stop_checker = StopChecker(eos_token_ids, context_len, decode)
        self.counters = SchedulerStats(self.queues, self.slots, decode, args.decode_log_interval)
        self.intake = Intake(
            self.queues,
            self.slots,
            self.counters,
            context_len=context_len,
            vocab_size=vocab_size,
            grammar=grammar,
            embeds=runner.embeds,
        )
        self.pace = PrefillPace(args.step_budget_ms / 1000, args.chunked_prefill_size, page)
        self.slots.prefill_cost = lambda: self.pace.seconds_per_token
        self.counters.pace = self.pace
        self.admission = PrefillAdmission(args, self.queues, self.slots, self.counters, self.pace)
        self._prefilled_last = False  # the last step was a prefill step
        self.decoding = DecodePlanner(args, self.queues, self.slots, self.counters, context_len)
        self.speculator = Speculator(
            args, self.slots, self.cache, context_len, vocab_size, self._speculates(args, runner)
        )
        self.launcher = StepLauncher(
            runner,
            self.queues,
            self.slots,
            self.stop_checker,
            self.counters,
            vocab_size,
            self.speculator,
        )
        self.pins = PinKeeper(self.cache, self.queues, self.cached_budget, clock)
        self.in_flight: InFlight | None = None

    @staticmethod
    def _snapshot_store(runner: ModelRunner) -> SnapshotStore | None:
        states = runner.snapshots
        return None if states is None else SnapshotStore(states.budget, states.release)

    def _tiers(self, tiers: KVTiers | None) -> KVTiers | None:
        """Hang the tiers below the tree: evicted leaves go down, admissions load back up."""
        if tiers is None:
            return None
        states = self.runner.snapshots
        portable = states is None or hasattr(states, "export")
        if self.cache.disable or not portable:
            why = "the radix cache is off" if self.cache.disable else "recurrent state"
            logger.info("KV cache tiers off: %s", why)
            tiers.close([])
            return None
        if states is not None:
            tiers.states = cast(StateTransfer, states)  # snapshots go down with their KV
        self.cache.on_evict = tiers.demote_leaf
        self.slots.tiers = tiers
        return tiers

    def close(self) -> None:
        """A graceful stop: what the tree caches goes down to disk (the tiers persist it)."""
        if self.tiers is not None:
            started = time.monotonic()
            self.tiers.close(self.cache.leaf_paths(), self.cache.snapshot_paths())
            logger.info("KV cache written to disk in %.1f s", time.monotonic() - started)
            self.tiers = self.slots.tiers = self.cache.on_evict = None

    @staticmethod
    def _speculates(args: SchedulerConfig, runner: ModelRunner) -> bool:
        if not args.speculative:
            return False
        if not runner.verifies:
            logger.warning("--speculative: this runner cannot verify drafts; decoding plainly")
            return False
        logger.info(
            "Speculative decoding: %s drafts, k <= %d", args.speculative, args.speculative_k
        )
        return True

    # ---- requests in and out -------------------------------------------------------------

    def add_request(self, msg: GenerateRequest) -> None:
        self.intake.add(msg)

    def abort(self, rid: str) -> None:
        self.intake.abort(rid)

    def has_work(self) -> bool:
        return not self.idle or self.queues.has_news

    @property
    def idle(self) -> bool:
        return not (self.queues.busy or self.in_flight)

    # ---- the loop ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Launch one batch (if any) and return every request's new tokens read since the last
        step: this step's own, or with overlap, the previous step's."""
        was_busy = not self.idle
        self.pins.sweep()
        if self.queues.compiling:
            self.intake.collect_grammars()
        if self.in_flight is not None and self.in_flight.needs_host_tokens:
            self._read_in_flight()
        batch = self._schedule()
        if batch:
            trim_cache(self.cache, self.cached_budget, self.clock())
        launched = self.launcher.launch(batch) if batch else None
        self.pins.apply(batch)  # the launch cached the prompts' KV
        self._read_in_flight()  # step N's tokens, read while step N+1 runs
        self.in_flight = launched
        if not self.overlap:
            self._read_in_flight()
        if was_busy and self.idle:
            self.check_invariants(idle=True)
        return self.queues.collect_outputs()

    def _schedule(self) -> list[Req]:
        """Prefill has priority; with --mixed-prefill the running requests decode along.
        Without it, a long prompt's chunks alternate with decode steps, so the requests that
        are generating are not stalled until the whole prompt is in."""
        if self._decode_turn():
            self._prefilled_last = False
            return self.decoding.plan()
        batch = self._admit_or_plan()
        self._prefilled_last = bool(batch) and batch[0].hold.state == ReqState.PREFILL
        return batch

    def _decode_turn(self) -> bool:
        q = self.queues
        return (
            self._prefilled_last
            and not self.mixed
            and q.chunked is not None
            and any(r.hold.state == ReqState.DECODE for r in q.running)
        )

    def _admit_or_plan(self) -> list[Req]:
        batch = self.admission.admit(self.decoding.new_token_ratio)
        if not batch and self.pins.unstick():
            batch = self.admission.admit(self.decoding.new_token_ratio)
        if not batch:
            return self.decoding.plan()
        return batch + self.decoding.ride_along() if self.mixed else batch

    def _read_in_flight(self) -> None:
        step, self.in_flight = self.in_flight, None
        if step is not None:
            self.launcher.read(step)

    # ---- checks and stats ----------------------------------------------------------------

    def check_invariants(self, idle: bool = False) -> None:
        """Pool, tree and requests agree on every slot (docs/architecture.md, "Invariants"); when idle, nothing is
        locked by requests (pins hold their prefixes until their deadline)."""
        owned = [self.slots.owned(r) for r in self.queues.holders()]
        check_invariants(self.pool, self.cache, idle=idle, owned=owned)
        self.runner.check_kv(self.pool)
        states, store = self.runner.snapshots, self.cache.snapshots
        if states is not None and store is not None and states.live != store.count:
            raise AssertionError(
                f"the runner holds {states.live} snapshots, the tree {store.count}"
            )

    @property
    def retractions(self) -> int:
        return self.counters.retractions

    def kv_usage(self) -> float:
        return self.counters.kv_usage()

    def stats(self) -> EngineStats:
        stats = self.counters.snapshot()
        if self.tiers is None:
            return stats
        return dataclasses.replace(stats, kv_tiers=self.tiers.stats())
