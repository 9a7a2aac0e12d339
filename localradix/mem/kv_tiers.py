"""KVTiers: the cache tiers under the radix tree (host memory, then disk), in chunks.

The tree holds device KV. When it evicts a leaf, `demote_leaf` copies the KV of the chunks
that end inside that leaf (the ancestors' slots are still live, so a chunk may straddle them)
down a tier instead of letting it go; the ancestors' own chunks follow when they are evicted in
turn; so does a path's tail shorter than a chunk, as a short chunk. When a request's cached
prefix ends short of its prompt, `fetch` walks the prompt's chunks past that point through the
tiers, then takes the leading tokens it shares with a chunk stored after the last one (a
prompt parts from a stored path anywhere, not on chunk boundaries; a token's KV depends only on
the tokens before it), and returns their KV if loading it back is cheaper than prefilling it:
decided from the measured load speed and the scheduler's measured prefill speed, not a
constant (before anything is measured, loading is tried). The caller writes the KV into fresh
slots and inserts them into the tree, so a tier hit is an ordinary cache hit.

For models with recurrent layers (whose KV alone cannot resume a request: `SnapshotStore`),
the state snapshots at the tree's nodes go down too (`demote_state`), named by their position's
tokens, and `fetch_state` finds the deepest one along a prompt from each tier's list of the
states kept after each chunk (one lookup per chunk, not a digest per position): a request then
resumes there from KV and state loaded back, as from any snapshot in memory.

Everything here is host-side numpy; the runner's `KVTransfer` moves KV between its device
buffers and the host, its `StateTransfer` a state. A transfer with `read_async` (GPUs) copies
demoted KV off the device while the engine goes on (`PendingChunks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Protocol

import numpy as np

from localradix.mem.disk_tier import DiskTier
from localradix.mem.host_tier import HostTier
from localradix.mem.kv_chunks import KVChunk, chain, next_digest, root_digest, state_digest
from localradix.mem.pending_chunks import PendingChunks, PendingRows, chunks
from localradix.mem.radix_node import TreeNode
from localradix.mem.state_index import StateIndex
from localradix.mem.tier_records import Fetched, TierCounters

logger = logging.getLogger("localradix.kv_tiers")

SMOOTHING = 0.5  # weight of the newest load-speed measurement
PENDING_BYTES = 256 << 20  # demoted KV still being copied off the device, at most


class KVUnavailable(RuntimeError):
    """A runner cannot copy out these slots' KV; the tiers then keep nothing of them."""


class KVTransfer(Protocol):
    """A runner's copy of KV between its device buffers and host memory, token-major."""

    bytes_per_token: int

    def read(self, slots: np.ndarray) -> np.ndarray:
        """uint8 [len(slots), bytes_per_token]: every layer's K and V of those slots."""
        ...

    def write(self, prefix: np.ndarray, slots: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        """Put rows as `read` returns them (`parts`, in order: one per slot) at `slots`, which
        continue a cached path whose slots are `prefix` (a runner whose KV is addressed by
        position, not slot, needs it: llama.cpp)."""
        ...


class StateTransfer(Protocol):
    """A runner's state snapshots (`StateSnapshots`) as bytes and back, for the tiers."""

    def export(self, handle: Any) -> np.ndarray:
        """uint8 [bytes]: the state `handle` names."""
        ...

    def adopt(self, data: np.ndarray, tokens: int) -> tuple[Any, int]:
        """(handle, bytes) of a state `export` gave, after `tokens` tokens."""
        ...


class KVTiers:
    def __init__(
        self,
        kv: KVTransfer,
        chunk: int,
        host: HostTier | None = None,
        disk: DiskTier | None = None,
        page: int = 1,
    ) -> None:
        if host is None and disk is None:
            raise ValueError("KVTiers needs a host or a disk tier")
        self.kv, self.chunk, self.host, self.disk = kv, chunk, host, disk
        self.page = page  # a load ends on a page boundary (the tree holds whole pages)
        if host is not None and disk is not None:
            host.spill = disk.put
        self.counters = TierCounters()
        self.load_bytes_per_s: float | None = None
        self.draining = False  # closing: a full write queue waits instead of dropping
        self.states: StateTransfer | None = None  # set for models with recurrent layers
        self.host_states = StateIndex(host.has if host is not None else lambda d: False)
        self.pending = PendingChunks(PENDING_BYTES)

    # ---- down ----------------------------------------------------------------------------------

    def demote_leaf(self, leaf: TreeNode) -> None:
        """Keep below the tree the chunks that end inside `leaf` (called before it is freed)."""
        keys, slots = [], []
        node: TreeNode | None = leaf
        while node is not None and node.parent is not None:
            keys.append(node.key)
            slots.append(node.value)
            node = node.parent
        key, values = np.concatenate(keys[::-1]), np.concatenate(slots[::-1])
        self.demote(key, values, leaf.extra_key, start=len(key) - len(leaf.key))
        if leaf.snapshot is not None and self.states is not None:
            self.demote_state(key, leaf.extra_key, leaf.snapshot)

    def demote_state(self, key: np.ndarray, extra_key: str | None, handle: Any) -> None:
        """Keep below the tree the state snapshot `handle` names, taken after `key`."""
        assert self.states is not None
        c = self.chunk
        whole = len(key) // c * c
        digests = chain(key, extra_key, c)
        parent = digests[-1] if digests else root_digest(extra_key)
        tail = np.array(key[whole:], dtype=np.int64)
        digest = state_digest(parent, tail)
        if self._touch(digest):
            return
        data = self.states.export(handle).reshape(1, -1)
        self._keep(KVChunk(digest, parent, tail, data, state=True))
        self.counters.demoted_states += 1

    def demote(
        self, key: np.ndarray, slots: np.ndarray, extra_key: str | None, start: int = 0
    ) -> int:
        """Keep the chunks of path `key` (KV at `slots`) whose end lies past `start`, unless a
        tier has them already; return the tokens copied."""
        c = self.chunk
        digests = chain(key, extra_key, c)
        parents = [root_digest(extra_key), *digests]
        spans = [(i * c, (i + 1) * c, parents[i], digests[i]) for i in range(len(digests))]
        if len(key) % c:  # the tail: a short chunk
            tail = len(digests) * c
            spans.append((tail, len(key), parents[-1], next_digest(parents[-1], key[tail:])))
        todo = [s for s in spans if s[1] > start and not self._touch(s[3])]
        if not todo:
            return 0
        rows = np.concatenate([slots[begin:end] for begin, end, _, _ in todo])
        named = [(d, parent, np.array(key[b:e], dtype=np.int64)) for b, e, parent, d in todo]
        read_async = getattr(self.kv, "read_async", None)
        try:
            pending: PendingRows | None = read_async(rows) if read_async is not None else None
            data = self.kv.read(rows) if pending is None else None
        except KVUnavailable as exc:  # the tiers are an optimisation: never stop the engine
            logger.warning("KV cache tiers: not keeping %d tokens (%s)", len(rows), exc)
            return 0
        if pending is not None:
            self.pending.add(named, pending, len(rows) * self.kv.bytes_per_token)
        self._settle(wait=False)
        for chunk in chunks(named, data) if data is not None else ():
            self._keep(chunk)
        self.counters.demoted_tokens += len(rows)
        return len(rows)

    def _settle(self, wait: bool) -> None:
        """Keep the demoted chunks whose copies are done (every one, waiting, with `wait`)."""
        for chunk in self.pending.take(wait):
            self._keep(chunk)

    def close(
        self,
        paths: list[tuple[np.ndarray, np.ndarray, str | None]],
        states: Sequence[tuple[np.ndarray, str | None, Any]] = (),
    ) -> None:
        """A graceful shutdown: everything cached (`paths`: root-to-leaf keys and slots;
        `states`: each snapshot's key, namespace and handle) and everything in host memory goes
        to disk, and the writer finishes."""
        if self.disk is None:
            return
        self._settle(wait=True)
        self.host, host = None, self.host  # straight to disk from now on
        self.draining = True
        for key, slots, extra_key in paths:
            self.demote(key, slots, extra_key)
        for key, extra_key, handle in states if self.states is not None else ():
            self.demote_state(key, extra_key, handle)
        self._settle(wait=True)
        if host is not None:
            for chunk in host.drain():
                self.disk.put(chunk, wait=True)
        self.disk.close()

    # ---- up ------------------------------------------------------------------------------------

    def fetch(
        self, key: np.ndarray, extra_key: str | None, start: int, prefill_s_per_token: float | None
    ) -> Fetched | None:
        """KV for `key[start:end]` from the tiers: the run of whole chunks they hold past
        `start`, then the tokens a chunk stored after those shares with `key` (never its last
        token, whose logits are computed); None when they hold none or prefilling is measured
        cheaper."""
        self._settle(wait=True)
        c = self.chunk
        digests = chain(key, extra_key, c)
        first = start // c
        held = first
        while held < len(digests) and self._has(digests[held]):
            held += 1
        parent = digests[held - 1] if held else root_digest(extra_key)
        rest = key[held * c : len(key) - 1]
        after = self._longest_child(parent, rest)
        end = held * c + (after[1] if after else 0)
        if end <= start:
            return None
        if not self._worth_loading(end - start, prefill_s_per_token):
            self.counters.skipped_tokens += end - start
            return None
        started = time.perf_counter()
        parts: list[np.ndarray] = []
        from_disk = 0
        for i in range(first, held):
            chunk, on_disk = self._get(digests[i])
            if chunk is None:  # damaged, or deleted by another server meanwhile
                after = None
                break
            parts.append(chunk.data)
            from_disk += c * on_disk
        if after is not None:
            chunk, on_disk = self._get(after[0])
            shared = self._shared(chunk.tokens, rest) if chunk is not None else 0
            if chunk is not None and shared > start - held * c:
                parts.append(chunk.data[:shared])  # a view
                from_disk += shared * on_disk
        if not parts:
            return None
        end = first * c + sum(len(p) for p in parts)
        parts[0] = parts[0][start - first * c :]  # a view: no copy of a whole prompt's KV
        self.counters.load_seconds += time.perf_counter() - started
        return Fetched(start, end, tuple(parts), min(from_disk, end - start))

    def fetch_state(
        self, key: np.ndarray, extra_key: str | None, after: int, upto: int
    ) -> tuple[int, Any, int] | None:
        """(position, handle, bytes) of the deepest state the tiers keep along `key` past
        `after` and at most `upto` (adopted by the runner), or None."""
        if self.states is None:
            return None
        self._settle(wait=True)
        c = self.chunk
        digests = chain(key, extra_key, c, upto=upto // c)
        for whole in range(upto // c, after // c - 1, -1):
            parent = digests[whole - 1] if whole else root_digest(extra_key)
            for end, digest in self._states_after(parent, key, whole * c, after, upto):
                chunk, _ = self._get(digest)
                if chunk is None or not chunk.state:
                    continue  # gone, damaged (warned), or a garbled line's name
                try:
                    handle, nbytes = self.states.adopt(chunk.data.reshape(-1), end)
                except ValueError as exc:  # a state another build of the runner wrote
                    logger.warning("KV cache tiers: not resuming from a state (%s)", exc)
                    continue
                self.counters.promoted_states += 1
                return end, handle, nbytes
        return None

    def _states_after(
        self, parent: bytes, key: np.ndarray, base: int, after: int, upto: int
    ) -> list[tuple[int, bytes]]:
        """(end, digest) of the states listed after chunk `parent` (which ends at `base`)
        that name `key[:end]` for some end in (after, upto], deepest first."""
        listed = self.host_states.get(parent)
        if self.disk is not None:
            listed += self.disk.states(parent)
        found = {}
        for digest, tail in listed:
            end = base + tail
            if after < end <= upto and end not in found:
                if state_digest(parent, key[base:end]) == digest:
                    found[end] = digest
        return sorted(found.items(), reverse=True)

    def _longest_child(self, parent: bytes, rest: np.ndarray) -> tuple[bytes, int] | None:
        """(digest, count) of the chunk held after `parent` whose tokens begin with the most
        of `rest` (whole pages of them), or None when none shares a page."""
        best: tuple[bytes, int] | None = None
        for digest, tokens in self._children(parent):
            shared = self._shared(tokens, rest)
            if shared and (best is None or shared > best[1]):
                best = (digest, shared)
        return best

    def _shared(self, tokens: np.ndarray, rest: np.ndarray) -> int:
        """Leading tokens `tokens` and `rest` share, in whole pages."""
        n = min(len(tokens), len(rest))
        differ = np.flatnonzero(tokens[:n] != rest[:n])
        shared = int(differ[0]) if len(differ) else n
        return shared // self.page * self.page

    def write(self, fetched: Fetched, prefix: np.ndarray, slots: np.ndarray) -> None:
        """Put fetched KV into the runner's buffers at `slots` (one per token), after the
        cached path `prefix`."""
        self.kv.write(prefix, slots, fetched.parts)

    def loaded(self, fetched: Fetched, seconds: float) -> None:
        """The caller wrote `fetched` into the tree's slots in `seconds` (read time included)."""
        n = fetched.end - fetched.start
        c = self.counters
        c.promotions += 1
        c.promoted_tokens += n
        c.disk_hit_tokens += fetched.from_disk
        if seconds > 0 and self.kv.bytes_per_token:  # (none: a model without attention)
            rate = n * self.kv.bytes_per_token / seconds
            old = self.load_bytes_per_s
            self.load_bytes_per_s = rate if old is None else old + SMOOTHING * (rate - old)

    def _worth_loading(self, tokens: int, prefill_s_per_token: float | None) -> bool:
        if prefill_s_per_token is None or self.load_bytes_per_s is None:
            return True
        load_s = tokens * self.kv.bytes_per_token / self.load_bytes_per_s
        return load_s < tokens * prefill_s_per_token

    # ---- tiers ---------------------------------------------------------------------------------

    def _has(self, digest: bytes) -> bool:
        if self.host is not None and self.host.has(digest):
            return True
        return self.disk is not None and self.disk.has(digest)

    def _children(self, parent: bytes) -> list[tuple[bytes, np.ndarray]]:
        found = self.host.children(parent) if self.host is not None else []
        return found + (self.disk.children(parent) if self.disk is not None else [])

    def _touch(self, digest: bytes) -> bool:
        """Whether a tier holds `digest` (marking it used), or it is on its way down."""
        if digest in self.pending:
            return True
        if self.host is not None and self.host.get(digest) is not None:
            return True
        if self.disk is not None and self.disk.has(digest):
            self.disk.touch(digest)
            return True
        return False

    def _get(self, digest: bytes) -> tuple[KVChunk | None, bool]:
        if self.host is not None:
            chunk = self.host.get(digest)
            if chunk is not None:
                return chunk, False
        return (self.disk.get(digest) if self.disk is not None else None), True

    def _keep(self, chunk: KVChunk) -> None:
        if self.host is not None:
            self.host.put(chunk)
            if chunk.state:
                self.host_states.add(chunk.parent, chunk.digest, len(chunk.tokens))
        elif self.disk is not None:
            self.disk.put(chunk, wait=self.draining)

    # ---- what the stats show -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        self._settle(wait=True)
        bpt = self.kv.bytes_per_token
        out: dict[str, Any] = asdict(self.counters)
        if self.host is not None:
            out.update(host_bytes=self.host.bytes, host_tokens=self.host.bytes // max(bpt, 1))
        if self.disk is not None:
            disk = self.disk.stats
            out.update(
                disk_bytes=self.disk.used_bytes,
                disk_dir=str(self.disk.root),
                disk_budget=self.disk.budget,
                disk_files_written=disk.files_written,
                disk_bytes_written=disk.bytes_written,
                disk_corrupt=disk.corrupt,
                disk_dropped=disk.dropped,
            )
        return out
