"""The cache tiers below the radix tree, on numpy stand-ins for a runner's KV buffers.

The fake KV of a token is a function of its whole prefix (as real KV is), so any chunk loaded
at the wrong place, from the wrong model or from a damaged file shows up as wrong bytes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localradix.mem.disk_tier import DiskTier, clear_stored, stored_models
from localradix.mem.host_tier import HostTier
from localradix.mem.invariants import check_invariants
from localradix.mem.kv_chunks import KVChunk, chain, chunk_size, root_digest
from localradix.mem.kv_pool import KVPool
from localradix.mem.kv_tiers import KVTiers
from localradix.mem.radix_cache import RadixCache

WIDTH = 24  # bytes of KV per token
CHUNK = 8


def kv_of(key: np.ndarray) -> np.ndarray:
    """The fake KV of every token of `key`: bytes determined by the token and all before it."""
    rows = np.empty((len(key), WIDTH), dtype=np.uint8)
    h = hashlib.blake2b(digest_size=WIDTH)
    for i, token in enumerate(key):
        h.update(int(token).to_bytes(8, "little"))
        rows[i] = np.frombuffer(h.copy().digest(), dtype=np.uint8)
    return rows


class FakeKV:
    """A runner's KV buffers: one row of bytes per slot."""

    bytes_per_token = WIDTH

    def __init__(self, slots: int) -> None:
        self.rows = np.zeros((slots + 1, WIDTH), dtype=np.uint8)

    def read(self, slots: np.ndarray) -> np.ndarray:
        return self.rows[slots].copy()

    def write(self, prefix: np.ndarray, slots: np.ndarray, parts) -> None:
        self.rows[slots] = np.concatenate(parts)


class InFlight:
    """A copy off the device under way: the rows as gathered, landed only when `landed`."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows, self.landed = rows, False

    def done(self) -> bool:
        return self.landed

    def result(self) -> np.ndarray:
        self.landed = True  # (waits)
        return self.rows


class AsyncFakeKV(FakeKV):
    """A GPU runner's buffers: `read_async` gathers the rows and leaves them in flight."""

    def __init__(self, slots: int) -> None:
        super().__init__(slots)
        self.flights: list[InFlight] = []

    def read(self, slots: np.ndarray) -> np.ndarray:
        raise AssertionError("the tiers read asynchronously when they can")

    def read_async(self, slots: np.ndarray) -> InFlight:
        self.flights.append(InFlight(self.rows[slots].copy()))
        return self.flights[-1]


def disk(tmp_path, fingerprint="model-a", budget=1 << 30, **kw) -> DiskTier:
    return DiskTier(tmp_path / "kv", fingerprint, budget, {"name": fingerprint}, **kw)


def chunk_at(key: np.ndarray, i: int, extra_key: str | None = None) -> KVChunk:
    digests = chain(key, extra_key, CHUNK)
    parent = digests[i - 1] if i else root_digest(extra_key)
    part = key[i * CHUNK : (i + 1) * CHUNK]
    return KVChunk(digests[i], parent, part.copy(), kv_of(key)[i * CHUNK : (i + 1) * CHUNK])


def files(tier: DiskTier) -> list:
    return sorted(tier.folder.rglob("*.kv"))


# ---- naming ------------------------------------------------------------------------------------


def test_a_chunk_name_fixes_its_whole_prefix_and_namespace():
    key = np.arange(40, dtype=np.int64)
    other = key.copy()
    other[3] = 99  # differs in the first chunk only
    a, b = chain(key, None, CHUNK), chain(other, None, CHUNK)
    assert len(a) == 5 and all(x != y for x, y in zip(a, b))  # every later name differs too
    assert chain(key, None, CHUNK, upto=2) == a[:2]
    assert chain(key, "lora-1", CHUNK)[0] != a[0]
    assert chain(key[:39], None, CHUNK) == a[:4]  # a partial chunk has no name
    assert chunk_size(1) == 32 and chunk_size(16) == 32 and chunk_size(24) == 48


# ---- the disk tier ---------------------------------------------------------------------------


def test_disk_round_trip_private_files_and_model_json(tmp_path):
    key = np.arange(100, 132, dtype=np.int64)
    tier = disk(tmp_path)
    chunk = chunk_at(key, 1)
    assert tier.put(chunk)
    assert tier.has(chunk.digest)  # served from the queue until written
    tier.flush()
    (path,) = files(tier)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(tier.folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "kv").stat().st_mode) == 0o700
    tier.close()
    again = disk(tmp_path)  # a restart
    got = again.get(chunk.digest)
    assert got is not None and np.array_equal(got.data, chunk.data)
    assert np.array_equal(got.tokens, chunk.tokens) and got.parent == chunk.parent
    (model,) = stored_models(tmp_path / "kv")
    assert model.model["name"] == "model-a" and model.files == 1 and model.bytes > 8 * WIDTH
    assert clear_stored(tmp_path / "kv") == model.bytes and not files(again)


@pytest.mark.parametrize("damage", ["truncate", "flip", "rename"])
def test_a_damaged_file_is_skipped_with_one_warning_and_deleted(tmp_path, caplog, damage):
    key = np.arange(64, dtype=np.int64)
    tier = disk(tmp_path)
    first, second = chunk_at(key, 0), chunk_at(key, 1)
    tier.put(first)
    tier.put(second)
    tier.flush()
    path = tier._path(first.digest)
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        raw[len(raw) // 2] ^= 0x10
        path.write_bytes(bytes(raw))
    else:  # a valid file under another chunk's name
        path.write_bytes(tier._path(second.digest).read_bytes())
    with caplog.at_level(logging.WARNING, logger="localradix.kv_disk"):
        assert tier.get(first.digest) is None
        assert tier.get(first.digest) is None  # gone: no second warning
    assert len(caplog.records) == 1 and str(path) in caplog.text
    assert tier.stats.corrupt == 1 and not path.exists()
    assert tier.get(second.digest) is not None  # the intact one still loads


def test_another_fingerprint_never_reads_these_files(tmp_path):
    key = np.arange(32, dtype=np.int64)
    a = disk(tmp_path, "model-a")
    a.put(chunk_at(key, 0))
    a.close()
    b = disk(tmp_path, "model-b")
    assert not b.has(chunk_at(key, 0).digest) and b.get(chunk_at(key, 0).digest) is None
    # Even a file copied into its folder is refused: the header names the model.
    src = a._path(chunk_at(key, 0).digest)
    dst = b._path(chunk_at(key, 0).digest)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())
    assert b.get(chunk_at(key, 0).digest) is None and b.stats.corrupt == 1


def test_the_budget_holds_and_the_least_recently_used_go_first(tmp_path):
    key = np.arange(8 * 40, dtype=np.int64)
    chunks = [chunk_at(key, i) for i in range(40)]
    size_one = len(disk(tmp_path, "probe")._encode(chunks[0]))
    clear_stored(tmp_path / "kv")
    tier = disk(tmp_path, budget=10 * size_one + size_one // 2)
    for i, chunk in enumerate(chunks[:10]):
        tier.put(chunk)
        tier.flush()
        os.utime(tier._path(chunk.digest), (1000 + i, 1000 + i))  # written in this order
    tier.touch(chunks[0].digest)  # the oldest is used again: now the newest
    for chunk in chunks[10:14]:
        tier.put(chunk)
        tier.flush()
    total = sum(p.stat().st_size for p in files(tier))
    assert total <= tier.budget
    kept = {p.stem for p in files(tier)}
    assert chunks[0].digest.hex() in kept  # touched: kept
    assert chunks[1].digest.hex() not in kept  # least recently used: gone
    assert chunks[13].digest.hex() in kept
    assert tier.stats.deleted >= 4


def test_two_servers_share_a_folder(tmp_path):
    key = np.arange(48, dtype=np.int64)
    a, b = disk(tmp_path), disk(tmp_path)
    for tier in (a, b):  # both write the same chunk: one file, both read it
        tier.put(chunk_at(key, 0))
        tier.flush()
    assert len(files(a)) == 1
    a.put(chunk_at(key, 1))
    a.flush()
    assert b.has(chunk_at(key, 1).digest) and b.get(chunk_at(key, 1).digest) is not None
    a._path(chunk_at(key, 1).digest).unlink()  # the other server's trim removed it
    assert b.get(chunk_at(key, 1).digest) is None and b.stats.corrupt == 0


def test_stale_temporary_files_are_swept_at_start(tmp_path):
    tier = disk(tmp_path)
    tier.close()
    stale = tier.folder / "ab" / ".x.kv.123.dead.tmp"
    stale.parent.mkdir()
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    fresh = tier.folder / "ab" / ".y.kv.456.live.tmp"  # another server writing right now
    fresh.write_bytes(b"half")
    disk(tmp_path)
    assert not stale.exists() and fresh.exists()


def test_a_full_write_queue_drops_unless_draining(tmp_path):
    key = np.arange(64, dtype=np.int64)
    tier = disk(tmp_path, queue_bytes=2 * CHUNK * WIDTH)  # two chunks waiting at most
    gate, real = threading.Event(), tier._write
    tier._write = lambda chunk: (gate.wait(), real(chunk))  # a slow disk
    accepted = [tier.put(chunk_at(key, i)) for i in range(4)]
    assert accepted == [True, True, False, False] and tier.stats.dropped == 2
    gate.set()
    assert tier.put(chunk_at(key, 5), wait=True)  # a drain waits for room instead
    tier.close()
    assert len(files(tier)) == 3


# ---- the host tier ---------------------------------------------------------------------------


def test_host_tier_spills_least_recently_used_to_disk(tmp_path):
    key = np.arange(40, dtype=np.int64)
    chunks = [chunk_at(key, i) for i in range(5)]
    spilled: list[KVChunk] = []
    host = HostTier(3 * chunks[0].nbytes, spill=spilled.append)
    for c in chunks[:3]:
        host.put(c)
    host.get(chunks[0].digest)  # used: newest
    host.put(chunks[3])
    assert [c.digest for c in spilled] == [chunks[1].digest]
    assert host.count == 3 and host.bytes == 3 * chunks[0].nbytes
    assert [c.digest for c in host.drain()] == [
        chunks[2].digest,
        chunks[0].digest,
        chunks[3].digest,
    ]
    assert host.count == 0 and host.bytes == 0


# ---- the tiers under a real radix cache -------------------------------------------------------


class Server:
    """A radix cache over a small pool, fake KV, and tiers: what the scheduler wires up."""

    def __init__(self, tmp_path, slots=64, page=1, host_bytes=0, with_disk=True, kv=FakeKV) -> None:
        self.pool = KVPool(slots, page_size=page)
        self.cache = RadixCache(self.pool, page_size=page)
        self.kv = kv(self.pool.num_slots)
        host = HostTier(host_bytes) if host_bytes else None
        self.disk = disk(tmp_path) if with_disk else None
        self.tiers = KVTiers(self.kv, CHUNK, host, self.disk, page=page)
        self.cache.on_evict = self.tiers.demote_leaf

    def prefill(self, key: np.ndarray) -> int:
        """What admission does: match (loading from the tiers), compute the rest, cache it.
        Returns the tokens found cached (memory or tiers)."""
        match = self.cache.match_prefix(key)
        fetched = self.tiers.fetch(key, None, match.matched_len, None)
        if fetched is not None:
            self.cache.lock(match.last_node)
            slots = self.pool.alloc(fetched.end - fetched.start)
            self.cache.unlock(match.last_node)
            assert slots is not None
            self.tiers.write(fetched, match.indices, slots)
            self.cache.insert(key[: fetched.end], np.concatenate([match.indices, slots]))
            self.tiers.loaded(fetched, 1e-3)
            match = self.cache.match_prefix(key)
        found = match.matched_len
        # The loaded KV is exactly what computing those tokens gives.
        assert np.array_equal(self.kv.rows[match.indices], kv_of(key)[:found])
        page = self.pool.page_size
        self.cache.lock(match.last_node)
        new = self.pool.alloc(-(-(len(key) - found) // page) * page)
        self.cache.unlock(match.last_node)
        assert new is not None
        self.kv.rows[new[: len(key) - found]] = kv_of(key)[found:]  # "computed"
        already = self.cache.insert(key, np.concatenate([match.indices, new]))
        assert already == found
        cached = len(key) // page * page  # the tree takes whole pages; the rest is freed
        self.pool.free(new[cached - found :])
        check_invariants(self.pool, self.cache, idle=True)
        return found


def test_evicted_prefixes_come_back_from_disk_and_after_a_restart(tmp_path):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 1000, 40) for _ in range(4)]
    server = Server(tmp_path, slots=64)
    for p in prompts:
        assert server.prefill(p) == 0
    assert server.tiers.counters.demoted_tokens > 0
    assert server.prefill(prompts[0]) == 40  # evicted, loaded back: all 5 chunks
    assert server.tiers.counters.disk_hit_tokens > 0
    server.tiers.close(server.cache.leaf_paths())  # a graceful stop
    restarted = Server(tmp_path, slots=64)
    for p in prompts:
        assert restarted.prefill(np.concatenate([p, [7, 7, 7]])) == 40
    longer = np.concatenate([prompts[1][:20], rng.integers(0, 1000, 30)])
    assert restarted.prefill(longer) == 20  # every token the two share, not only whole chunks


def test_a_path_parted_from_inside_a_chunk_or_past_its_tail_is_found_whole(tmp_path):
    """A stored path's tail shorter than a chunk is kept (a short chunk), and a prompt that
    parts from a stored path inside a chunk gets the tokens they share, after a restart too."""
    rng = np.random.default_rng(5)
    stem = rng.integers(0, 1000, 45)  # five whole chunks and a tail of 5
    server = Server(tmp_path, slots=64)
    assert server.prefill(stem) == 0
    server.tiers.close(server.cache.leaf_paths())
    restarted = Server(tmp_path, slots=64)
    assert restarted.prefill(np.concatenate([stem, [1, 2]])) == 45
    for listing in (tmp_path / "kv").rglob("*.next"):  # a torn line, and one naming nothing
        with listing.open("ab") as f:
            f.write(b"00ff 1,2,3\n" + b"ab" * 16 + b" 4,5\n" + b"0123")
    again = Server(tmp_path, slots=64)
    parted = np.concatenate([stem[:43], [1001, 1002]])
    assert again.prefill(parted) == 43
    fresh = Server(tmp_path, slots=64)
    assert fresh.prefill(stem[:30]) == 29  # all but the last token (its logits are computed)
    paged = Server(tmp_path, slots=64, page=4)  # the same files, whole pages only
    assert paged.prefill(parted) == 40


def test_a_host_tier_finds_a_parted_prompt_inside_a_chunk(tmp_path):
    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, 1000, 36) for _ in range(3)]
    server = Server(tmp_path, slots=40, host_bytes=1 << 20, with_disk=False)
    for p in prompts:
        server.prefill(p)
    assert server.prefill(np.concatenate([prompts[0][:21], [5000]])) == 21


def test_a_host_tier_serves_before_disk(tmp_path):
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 1000, 32) for _ in range(4)]
    server = Server(tmp_path, slots=48, host_bytes=1 << 20, with_disk=False)
    for p in prompts:
        server.prefill(p)
    assert server.prefill(prompts[0]) == 32
    c = server.tiers.counters
    assert c.promoted_tokens > 0 and c.disk_hit_tokens == 0


def test_loading_is_skipped_when_prefill_is_measured_cheaper(tmp_path):
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 1000, 40) for _ in range(3)]
    server = Server(tmp_path, slots=64)
    for p in prompts:
        server.prefill(p)
    server.tiers.load_bytes_per_s = 1000.0  # 24 ms a token...
    assert server.tiers.fetch(prompts[0], None, 0, prefill_s_per_token=1e-3) is None  # ...1 ms
    assert server.tiers.counters.skipped_tokens == 40
    assert server.tiers.fetch(prompts[0], None, 0, prefill_s_per_token=1.0) is not None


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 50)), min_size=1, max_size=25),
    st.sampled_from([1, 4]),
)
def test_whatever_is_evicted_and_reloaded_the_kv_is_right(tmp_path_factory, ops, page):
    """Prompts over a few shared stems, through a pool that keeps evicting: every prefix found
    (in memory or loaded from disk) has exactly its own KV, and the accounting holds."""
    tmp_path = tmp_path_factory.mktemp("tiers")
    rng = np.random.default_rng(len(ops))
    stems = [rng.integers(0, 50, 60) for _ in range(4)]
    server = Server(tmp_path, slots=96, page=page)
    for stem, length in ops:
        key = np.concatenate([stems[stem][:length], rng.integers(0, 50, 3)])
        server.prefill(key)  # asserts the KV of whatever it found
    server.tiers.close(server.cache.leaf_paths())


def test_kv_copied_off_asynchronously_goes_down_once_in_order_when_needed(tmp_path):
    """Demoted KV still in flight is named (not copied again) and goes into the host tier when
    its copy lands or a lookup needs it, oldest first; a graceful stop waits for all of it."""
    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, 1000, 40) for _ in range(4)]
    server = Server(tmp_path, slots=64, host_bytes=1 << 20, kv=AsyncFakeKV)
    tiers, host = server.tiers, server.tiers.host
    assert host is not None
    for p in prompts[:2]:
        server.prefill(p)
    server.cache.evict(80)  # both paths go down: the copies are in flight
    flights = list(server.kv.flights)
    assert flights and host.count == 0 and tiers.pending.bytes == 80 * WIDTH
    assert tiers.demote(prompts[0], np.arange(1, 41), None) == 0  # on its way: not again
    flights[0].landed = True  # the first lands: it goes into the host tier at the next demote
    assert tiers.demote(prompts[3], np.arange(1, 41), None) == 40
    assert host.count == 5 and not flights[1].landed
    assert server.prefill(prompts[1]) == 40  # the fetch waits for the rest
    assert [f.landed for f in server.kv.flights] == [True] * len(server.kv.flights)
    assert [c.digest for c in host.drain()][:5] == chain(prompts[0], None, CHUNK)
    assert tiers.counters.demoted_tokens == 120


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 50)), min_size=1, max_size=25))
def test_kv_copied_off_asynchronously_is_right_whatever_is_evicted(tmp_path_factory, ops):
    """As the synchronous property above, with every demotion left in flight until needed,
    host memory above disk, and a restart that finds everything the graceful stop kept."""
    tmp_path = tmp_path_factory.mktemp("async-tiers")
    rng = np.random.default_rng(len(ops))
    stems = [rng.integers(0, 50, 60) for _ in range(4)]
    server = Server(tmp_path, slots=96, host_bytes=40 * WIDTH * 8, kv=AsyncFakeKV)
    keys = [np.concatenate([stems[s][:n], rng.integers(0, 50, 3)]) for s, n in ops]
    for key in keys:
        server.prefill(key)  # asserts the KV of whatever it found
    server.tiers.close(server.cache.leaf_paths())
    restarted = Server(tmp_path, slots=96)
    assert restarted.prefill(keys[-1]) >= len(keys[-1]) - 1  # (a whole last chunk: all)


WRITER = """
import sys
import numpy as np
from pathlib import Path
from localradix.mem.disk_tier import DiskTier
from localradix.mem.kv_chunks import KVChunk, chain, root_digest

tier = DiskTier(Path(sys.argv[1]), "model-a", 1 << 30, {})
rng = np.random.default_rng(int(sys.argv[2]))
print("ready", flush=True)
while True:
    key = rng.integers(0, 1000, 64)
    digests = chain(key, None, 8)
    for i, digest in enumerate(digests):
        tokens = key[i * 8 : (i + 1) * 8]
        data = np.repeat((tokens % 251).astype(np.uint8)[:, None], 1 << 17, axis=1)
        tier.put(KVChunk(digest, digests[i - 1] if i else root_digest(None), tokens, data), True)
"""


def test_sigkill_while_writing_leaves_only_whole_files(tmp_path):
    """A server killed mid-write (random moments, five times): every chunk file the next start
    finds loads intact, with the KV its tokens had."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    rng = np.random.default_rng(7)
    for round_ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path / "kv"), str(round_)],
            stdout=subprocess.PIPE, env=env,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(float(rng.uniform(0.05, 0.6)))
        proc.kill()
        proc.wait()
    tier = disk(tmp_path)
    found = files(tier)
    assert len(found) >= 5
    for path in found:
        chunk = tier.get(bytes.fromhex(path.stem))
        assert chunk is not None
        assert (chunk.data == (chunk.tokens % 251).astype(np.uint8)[:, None]).all()
    assert tier.stats.corrupt == 0


def test_kv_a_runner_cannot_copy_out_is_dropped_not_fatal(tmp_path, caplog):
    """Eviction goes on when the runner cannot read a leaf's KV (llama.cpp with no sequence
    holding the whole path): the tiers keep nothing of it and say so."""
    from localradix.mem.kv_tiers import KVUnavailable

    server = Server(tmp_path, slots=64)

    def refuse(slots):
        raise KVUnavailable("no sequence holds them")

    server.kv.read = refuse
    rng = np.random.default_rng(3)
    with caplog.at_level(logging.WARNING, logger="localradix.kv_tiers"):
        for _ in range(4):
            server.prefill(rng.integers(0, 1000, 40))  # evicts: each demotion is refused
    assert server.tiers.counters.demoted_tokens == 0 and "not keeping" in caplog.text
    check_invariants(server.pool, server.cache, idle=True)
