"""The KV slot handoff between a request and the radix tree (docs/architecture.md, "Slot ownership").

A request's row in the `ReqToTokenPool` maps its positions to slots: `[:cached_len]` belong
to the tree (kept alive by the lock on `last_node`), `[cached_len:kv_len]` and the reserved
rest of its open page belong to the request. This room moves slots across that line: claim a
cached prefix at admission, reserve new slots, hand computed KV to the tree, release a
leaving request. It is the one writer of a request's `CacheHold` (`req.hold`): its row, lock,
KV lengths and scheduling state change only here.

For models with recurrent layers (`ModelRunner.snapshots`), KV slots alone cannot resume a
request inside a cached path: it resumes from the deepest node holding a state snapshot, and
this room takes snapshots where later requests will want them (the prefill stops there first:
`snapshot_cap`): where a request's cached path branches off, at the end of its prompt (a
chat's next turn holds this prompt whole, though its copy of the reply may tokenize otherwise),
where a request leaves, every 16 generated tokens, and every 1/8 of a prompt that found nothing
cached (a second request on a new prefix resumes near its branch point); the last two are weak:
they go first when the budget is short.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from localradix.mem.kv_pool import KVPool, ReqToTokenPool
from localradix.mem.radix_cache import MatchResult, RadixCache
from localradix.mem.radix_node import EMPTY, TreeNode
from localradix.sched.cache_budget import cold_from
from localradix.sched.request import Req, ReqState
from localradix.spec.draft_kv import rejected_slots

COLD_SNAPSHOTS = 8  # snapshots along a prompt that found nothing cached...
MIN_SNAPSHOT_STRIDE = 32  # ...at least this many tokens apart (each costs a prefill chunk)
DECODE_SNAPSHOT_STRIDE = 16  # generated tokens between weak snapshots (see `cache_decoded`)

if TYPE_CHECKING:
    from localradix.mem.kv_tiers import Fetched, KVTiers
    from localradix.runner.base import StateSnapshots


@dataclass(eq=False)
class SlotHandoff:
    pool: KVPool
    req_pool: ReqToTokenPool
    cache: RadixCache
    clock: Callable[[], float] = time.monotonic  # when one-off prefixes turn cold
    states: StateSnapshots | None = None  # the runner's, for models with recurrent layers
    tiers: KVTiers | None = None  # host-memory and disk tiers below the tree
    # The measured prefill cost (seconds per token; None before any), against which loading
    # KV back from a tier is weighed.
    prefill_cost: Callable[[], float | None] = lambda: None

    def __post_init__(self) -> None:
        if self.states is not None and self.page != 1:
            raise ValueError("state snapshots need --page-size 1 (a node may end anywhere)")

    @property
    def page(self) -> int:
        return self.pool.page_size

    def round_up(self, n: int) -> int:
        """`n` tokens rounded up to whole pages."""
        return -(-n // self.page) * self.page

    def align_chunk(self, extend: int, todo: int) -> int:
        """A chunk that stops short of the prompt's end must end on a page boundary."""
        return extend if extend >= todo else extend // self.page * self.page

    def match(self, req: Req, promote: bool = False) -> None:
        """Refresh `req.hold.prefix_match`: the cached prefix of its tokens (takes no lock). A
        mean-pooled embedding matches none: it needs every token's hidden state. With
        `promote` (at admission), KV the tiers below the tree hold past it is loaded first."""
        if req.ask.embed is not None and req.ask.embed.pooling == "mean":
            req.hold.prefix_match = MatchResult(EMPTY, self.cache.root, 0, None)
            return
        if self.states is None:
            match = self.cache.match_prefix(req.all_ids, extra_key=req.ask.extra_key)
            req.hold.prefix_match = self._promote(req, match) if promote and self.tiers else match
            return
        # The last token is always computed (its logits), so no snapshot is needed past it.
        match = self.cache.match_prefix(req.all_ids[:-1], extra_key=req.ask.extra_key)
        if promote and self.tiers:
            match = self._promote_resumable(req, match)
        req.hold.branch_at = match.matched_len
        req.hold.prefix_match = self.cache.resume_point(match)
        cold = req.hold.prefix_match.matched_len == 0 and not self.cache.disable
        req.hold.snapshot_stride = (
            max(MIN_SNAPSHOT_STRIDE, -(-req.seq_len // COLD_SNAPSHOTS)) * cold
        )

    def _promote(self, req: Req, match: MatchResult) -> MatchResult:
        """`match`, extended by KV the tiers below the tree hold past it (loaded into fresh
        slots and inserted into the tree: a tier hit is then an ordinary cache hit)."""
        tiers, key, start = self.tiers, req.all_ids, match.matched_len
        assert tiers is not None
        if start >= len(key) - 1 or req.hold.tier_miss_at == start:
            return match  # nothing to load but the last token (always computed), or looked
        started = time.perf_counter()
        fetched = tiers.fetch(key, req.ask.extra_key, start, self.prefill_cost())
        if fetched is None or not self._load(req, match, fetched, started):
            req.hold.tier_miss_at = start
            return match
        return self.cache.match_prefix(key, extra_key=req.ask.extra_key, count_hit=False)

    def _promote_resumable(self, req: Req, match: MatchResult) -> MatchResult:
        """For models with recurrent layers: `match` (of all but the last token), extended to
        the deepest state snapshot the tiers keep past its resume point, with the KV up to it
        (KV alone cannot resume such a model)."""
        tiers, key, start = self.tiers, req.all_ids, match.matched_len
        assert tiers is not None and self.cache.snapshots is not None
        resume = self.cache.resume_point(match).matched_len
        if resume >= len(key) - 1 or req.hold.tier_miss_at == start:
            return match
        started = time.perf_counter()
        fetched = None
        if start < len(key) - 1:
            fetched = tiers.fetch(key, req.ask.extra_key, start, self.prefill_cost())
        upto = min(fetched.end if fetched is not None else start, len(key) - 1)
        found = tiers.fetch_state(key, req.ask.extra_key, resume, upto)
        if found is None:
            req.hold.tier_miss_at = start
            return match
        at, handle, nbytes = found
        if fetched is not None and at > start:
            if not self._load(req, match, fetched.cut(at), started):
                self.cache.snapshots.release(handle)
                req.hold.tier_miss_at = start
                return match
        node = self.cache.match_prefix(key[:at], req.ask.extra_key, count_hit=False).last_node
        self.cache.snapshots.attach(node, handle, nbytes)  # (released if it has one)
        return self.cache.match_prefix(key[:-1], extra_key=req.ask.extra_key, count_hit=False)

    def _load(self, req: Req, match: MatchResult, fetched: Fetched, started: float) -> bool:
        """Write `fetched` into fresh slots after `match` and insert them into the tree
        (`started`: when reading began, for the load speed); False if the pool is short."""
        assert self.tiers is not None
        self.cache.lock(match.last_node)  # nothing below may evict the path it continues
        try:
            slots = self.pool.alloc(fetched.end - fetched.start)
            if slots is None:
                return False
            self.tiers.write(fetched, match.indices, slots)
            path = np.concatenate([match.indices, slots])
            already = self.cache.insert(
                req.all_ids[: fetched.end], path, extra_key=req.ask.extra_key
            )
            if already > fetched.start:  # cannot happen on one thread; never leak slots
                self.pool.free(slots[: already - fetched.start])
        finally:
            self.cache.unlock(match.last_node)
        self.tiers.loaded(fetched, time.perf_counter() - started)
        return True

    def first_admission(self, req: Req, cached: int) -> None:
        """Record that `cached` prompt tokens were served from the cache at `req`'s first
        admission, and count the cached tokens past its resume point."""
        req.hold.cached_tokens = cached
        if self.cache.snapshots is not None:
            self.cache.snapshots.unresumed += max(req.hold.branch_at - cached, 0)

    def snapshot_cap(self, req: Req, start: int, extend: int) -> int:
        """`extend` tokens from `start`, cut to stop at the next point where the request takes
        a snapshot (its branch point, or a stride of a cold prompt), if one lies inside."""
        if self.states is None:
            return extend
        stops = [req.hold.branch_at]
        if req.hold.snapshot_stride:
            stops.append((start // req.hold.snapshot_stride + 1) * req.hold.snapshot_stride)
        inside = [p for p in stops if start < p < min(start + extend, req.seq_len)]
        return min(inside) - start if inside else extend

    def owned(self, req: Req) -> np.ndarray:
        """Slots the request (not the tree) owns: past its cached prefix, up to its page end."""
        assert req.hold.row is not None
        end = self.round_up(req.hold.kv_len + req.hold.spec_len)
        return self.req_pool.table[req.hold.row, req.hold.cached_len : end]

    def claim(self, req: Req, match: MatchResult, cached: int, extend: int) -> bool:
        """Give `req` a row, lock its first `cached` matched tokens and reserve slots for the
        next `extend`; False (everything undone) if the rows or the pool are short."""
        row = self.req_pool.alloc()
        if row is None:
            return False
        self.cache.lock(match.last_node)
        req.hold.row, req.hold.kv_len = row, cached
        if not self.reserve(req, extend):
            self.cache.unlock(match.last_node)
            self.req_pool.free(row)
            req.hold.row, req.hold.kv_len = None, 0
            return False
        req.hold.last_node, req.hold.cached_len = match.last_node, cached
        self.req_pool.table[row, :cached] = match.indices[:cached]
        if self.states is not None:
            self._resume(req, match, cached)
        return True

    def start_extend(self, req: Req, extend: int) -> None:
        """`req` prefills its next `extend` tokens in this step (their slots are reserved)."""
        req.hold.extend_len = extend
        req.hold.state = ReqState.PREFILL

    def _resume(self, req: Req, match: MatchResult, cached: int) -> None:
        assert (
            self.states is not None
            and self.cache.snapshots is not None
            and req.hold.row is not None
        )
        node = match.last_node if cached else self.cache.root
        assert node is self.cache.root or cached == match.matched_len, "resume off a snapshot"
        self.states.restore(req.hold.row, node.snapshot)
        self.cache.snapshots.hits += node.snapshot is not None

    def reserve(self, req: Req, n: int) -> bool:
        """Map positions [kv_len, kv_len + n) to slots: the rest of the request's open page,
        then whole new pages (their unused tail stays reserved in the table row)."""
        assert req.hold.row is not None
        start, open_end = req.hold.kv_len, self.round_up(req.hold.kv_len)
        need = n - min(open_end - start, n)
        if need == 0:
            return True
        slots = self.pool.alloc(self.round_up(need))
        if slots is None:
            return False
        self.req_pool.table[req.hold.row, open_end : open_end + len(slots)] = slots
        return True

    def decode_need(self, batch: list[Req]) -> int:
        """Slots one decode step must allocate: a page for each request whose page is full."""
        return sum(r.hold.kv_len % self.page == 0 for r in batch) * self.page

    def open_decode_pages(self, batch: list[Req]) -> bool:
        """Give each request whose page is full a new page, and schedule one token for every
        request of `batch`; False (nothing taken) if short."""
        opening = [r for r in batch if r.hold.kv_len % self.page == 0]
        slots = self.pool.alloc(len(opening) * self.page)
        if slots is None:
            return False
        for i, req in enumerate(opening):
            assert req.hold.row is not None
            page = slots[i * self.page : (i + 1) * self.page]
            self.req_pool.table[req.hold.row, req.hold.kv_len : req.hold.kv_len + self.page] = page
        for req in batch:
            req.hold.extend_len = 1
        return True

    def reserve_drafts(self, req: Req, k: int) -> bool:
        """Map positions [kv_len + 1, kv_len + 1 + k) (drafts after the decode token, whose
        page `open_decode_pages` opened) to free slots; False (nothing taken) when the pool
        would have to evict cached prefixes for them: drafts are worth less than the cache.
        On success the step extends by the decode token and the `k` drafts."""
        assert req.hold.row is not None
        have, want = self.round_up(req.hold.kv_len + 1), self.round_up(req.hold.kv_len + 1 + k)
        if want - have > self.pool.available:
            return False
        slots = self.pool.alloc(want - have)
        if slots is None:
            return False
        self.req_pool.table[req.hold.row, have:want] = slots
        req.hold.extend_len = 1 + k
        return True

    def drop_rejected(self, req: Req, kept: int) -> None:
        """After a verify step: only `kept` positions hold real tokens; free whole pages of
        rejected drafts at once (llama.cpp's cells go with them, via the pool's listener)."""
        assert req.hold.row is not None
        written = req.hold.kv_len + req.hold.spec_len
        self.pool.free(rejected_slots(self.req_pool.table[req.hold.row], kept, written, self.page))
        req.hold.kv_len, req.hold.spec_len = kept, 0

    def advance(self, req: Req, drafts: int) -> bool:
        """KV bookkeeping at launch: the step computes the scheduled positions, its last
        `drafts` of them unverified drafts. True when the request samples a token in this step
        (a prefill whose prompt is all in moves to decode, an embedding's stays in prefill)."""
        hold = req.hold
        was_prefill = hold.state == ReqState.PREFILL
        hold.spec_len = drafts  # written now, verified at the read
        hold.kv_len += hold.extend_len - drafts
        hold.extend_len = 0
        if not was_prefill:
            self.cache_decoded(req)
            return True
        self.cache_unfinished(req)
        if hold.kv_len < req.seq_len:  # a chunk of a longer prefill: no token yet
            return False
        if req.ask.embed is None:
            hold.state = ReqState.DECODE
        return True

    def cache_unfinished(self, req: Req) -> None:
        """Insert the computed prefix into the tree so others can share it; move our lock
        (models with recurrent state: and snapshot where `snapshot_cap` stopped the chunk)."""
        if self.cache.disable or not self._cache_computed(req) or self.states is None:
            return
        strong = req.hold.kv_len in (req.hold.branch_at, req.seq_len)  # a branch, the prompt's end
        stride = req.hold.snapshot_stride and req.hold.kv_len % req.hold.snapshot_stride == 0
        if strong or stride:
            self._snapshot(req, self._node(req), weak=not strong)

    def cache_decoded(self, req: Req) -> None:
        """Models with recurrent state: every `DECODE_SNAPSHOT_STRIDE` generated tokens, cache
        the path so far with a weak snapshot at its end. A chat client sends the reply back as
        text, which may tokenize to other ids from some point on: the next turn resumes at the
        last snapshot before it (without these, at the previous prompt's end)."""
        if self.states is None or self.cache.disable or req.hold.kv_len % DECODE_SNAPSHOT_STRIDE:
            return
        if req.seq_len == req.hold.kv_len and self._cache_computed(req):  # (overlap: not yet)
            self._snapshot(req, self._node(req), weak=True)

    def _cache_computed(self, req: Req) -> bool:
        """Insert what `req` computed, take the tree's slots for it, move the lock to its end;
        True when the tree's path now ends exactly at `req.hold.kv_len`."""
        assert req.hold.row is not None
        slots = self.req_pool.table[req.hold.row, : req.hold.kv_len]
        ids = req.all_ids[: req.hold.kv_len]
        cold = cold_from(req, self.clock())
        already = self.cache.insert(ids, slots.copy(), req.ask.extra_key, cold_from=cold)
        self.pool.free(slots[req.hold.cached_len : already])
        match = self.cache.match_prefix(ids, extra_key=req.ask.extra_key, count_hit=False)
        self.req_pool.table[req.hold.row, : match.matched_len] = match.indices
        self.cache.lock(match.last_node)
        self.cache.unlock(self._node(req))
        req.hold.last_node, req.hold.cached_len = match.last_node, match.matched_len
        return match.matched_len == req.hold.kv_len

    def release(self, req: Req) -> None:
        """Give a leaving request's KV to the tree (cached, evictable) and free its row."""
        if req.hold.row is None:
            return
        slots = self.req_pool.table[
            req.hold.row, : self.round_up(req.hold.kv_len + req.hold.spec_len)
        ].copy()
        if self.cache.disable:
            self.pool.free(slots)
        else:
            whole = req.hold.kv_len // self.page * self.page  # the tree keeps whole pages only
            cold = cold_from(req, self.clock())
            already = self.cache.insert(
                req.all_ids[:whole], slots[:whole], req.ask.extra_key, cold_from=cold
            )
            self.pool.free(slots[req.hold.cached_len : already])
            self.pool.free(slots[whole:])  # the open page, reserved tail included
            self._snapshot_end(req, whole)
            self.cache.unlock(self._node(req))
        self.req_pool.free(req.hold.row)
        req.hold.row, req.hold.last_node, req.hold.cached_len, req.hold.kv_len = None, None, 0, 0
        req.hold.spec_len = 0

    def retract(self, req: Req) -> None:
        """Send `req` back to waiting: its KV goes to the tree and its match is forgotten."""
        self.release(req)
        req.hold.state = ReqState.WAITING
        req.hold.prefix_match = None

    @staticmethod
    def _node(req: Req) -> TreeNode:
        """The tree node `req` locks (it has one while it holds a row)."""
        assert req.hold.last_node is not None
        return req.hold.last_node

    def _snapshot_end(self, req: Req, length: int) -> None:
        """Snapshot a leaving request's state at the end of its cached path (a chat's next
        turn resumes there)."""
        if self.states is None or length == 0 or length != req.hold.kv_len:
            return
        match = self.cache.match_prefix(req.all_ids[:length], req.ask.extra_key, count_hit=False)
        if match.matched_len == length:
            self._snapshot(req, match.last_node)

    def _snapshot(self, req: Req, node: TreeNode, weak: bool = False) -> None:
        """Attach the state of `req`'s row (at the end of `node`) to `node`, unless it has one
        (`weak`: one of the first to go when the budget is short)."""
        if self.states is None or self.cache.snapshots is None or node.snapshot is not None:
            return
        if node is self.cache.root:
            return
        assert req.hold.row is not None
        handle, nbytes = self.states.save(req.hold.row)
        self.cache.snapshots.attach(node, handle, nbytes, weak)
