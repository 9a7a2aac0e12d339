"""`KVTiers.fetch_state` finds model states (recurrent layers) through a per-chunk list of the
states stored after each chunk (host memory: `StateIndex`; disk: a `.states` file beside the
chunks), not a digest and a stat per position; torn, garbled or stale lines are misses."""

from __future__ import annotations

import numpy as np
import pytest

import localradix.mem.kv_tiers as kv_tiers
from localradix.mem.disk_files import STATES_SUFFIX, clear_stored
from localradix.mem.disk_tier import DiskTier
from localradix.mem.host_tier import HostTier
from localradix.mem.kv_chunks import chain, root_digest
from localradix.mem.kv_tiers import KVTiers
from localradix.mem.state_index import StateIndex

CHUNK = 8


class FakeKV:
    bytes_per_token = 4

    def read(self, slots):
        raise AssertionError("fetch_state reads no KV")

    def write(self, prefix, slots, parts):
        raise AssertionError("fetch_state writes no KV")


class FakeStates:
    """A runner's states: a handle names bytes that say which prefix length they follow."""

    def __init__(self) -> None:
        self.adopted: list[tuple[bytes, int]] = []

    def export(self, handle: int) -> np.ndarray:
        return np.frombuffer(int(handle).to_bytes(8, "little") * 3, dtype=np.uint8).copy()

    def adopt(self, data: np.ndarray, tokens: int) -> tuple[int, int]:
        handle = int.from_bytes(bytes(data[:8]), "little")
        if handle != tokens:  # a state is only ever named by the length it was taken at
            raise ValueError("a state named for another position")
        self.adopted.append((bytes(data), tokens))
        return handle, len(data)


def open_tiers(tmp_path, host: bool = False, disk: bool = True) -> KVTiers:
    tier = DiskTier(tmp_path / "kv", "model", 1 << 30, {}) if disk else None
    tiers = KVTiers(FakeKV(), CHUNK, HostTier(1 << 20) if host else None, tier)
    tiers.states = FakeStates()
    return tiers


def keep(tiers: KVTiers, key: np.ndarray, ends: list[int]) -> None:
    """States after `key[:end]` for each end (the handle is the length, see FakeStates)."""
    for end in ends:
        tiers.demote_state(key[:end], None, end)
    if tiers.disk is not None:
        tiers.disk.flush()


KEY = np.arange(1000, 1100, dtype=np.int64)


@pytest.mark.parametrize("where", ["disk", "host", "restart"])
def test_the_deepest_state_along_a_prompt_is_found(tmp_path, where):
    tiers = open_tiers(tmp_path, host=where == "host")
    keep(tiers, KEY, [5, 16, 29, 30, 61])
    if where == "restart":
        tiers.close([])
        tiers = open_tiers(tmp_path)
    assert tiers.fetch_state(KEY, None, 0, 99)[:2] == (61, 61)
    assert tiers.fetch_state(KEY, None, 0, 60)[:2] == (30, 30)  # at most `upto`
    assert tiers.fetch_state(KEY, None, 16, 29)[:2] == (29, 29)
    assert tiers.fetch_state(KEY, None, 16, 28) is None  # only past `after`
    assert tiers.fetch_state(KEY, None, 0, 15)[:2] == (5, 5)
    assert tiers.fetch_state(KEY, None, 0, 16)[:2] == (16, 16)  # on a chunk boundary
    other = KEY.copy()
    other[20] += 1  # parts inside the third chunk: states past it name other tokens
    assert tiers.fetch_state(other, None, 0, 99)[:2] == (16, 16)
    assert tiers.fetch_state(KEY, "another namespace", 0, 99) is None


def test_a_miss_reads_one_list_per_chunk_and_names_no_position(tmp_path, monkeypatch):
    """Over an 8k-token prompt with nothing stored: one states list looked up per chunk, no
    digest computed and no chunk file probed (the scan it replaced: 8k of each)."""
    tiers = open_tiers(tmp_path)
    key = np.arange(8200, dtype=np.int64)
    keep(tiers, key, [3])  # one state, before `after`: listed, never a candidate
    lists, digests = [], []
    real_states, real_digest = tiers.disk.states, kv_tiers.state_digest
    monkeypatch.setattr(tiers.disk, "states", lambda p: lists.append(p) or real_states(p))
    monkeypatch.setattr(kv_tiers, "state_digest", lambda *a: digests.append(a) or real_digest(*a))
    monkeypatch.setattr(tiers.disk, "has", lambda d: pytest.fail("probed a chunk file"))
    assert tiers.fetch_state(key, None, 4, 8191) is None
    assert len(lists) == 8191 // CHUNK + 1 and not digests


def test_torn_garbled_and_stale_lines_are_misses(tmp_path, caplog):
    tiers = open_tiers(tmp_path)
    keep(tiers, KEY, [21, 22])
    parent = chain(KEY, None, CHUNK)[1]  # the chunk both states follow
    listing = next(tiers.disk.folder.rglob(parent.hex() + STATES_SUFFIX))
    good = listing.read_bytes()
    deepest = tiers.disk._path(kv_tiers.state_digest(parent, KEY[16:22]))
    deepest.unlink()  # a line naming a file deleted since (another server's trim)
    junk = b"zz 3\n" + b"ab" * 16 + b" -1\n" + b"\x00\xff garbage\n" + b"12" * 16 + b" 5\n"
    listing.write_bytes(junk + good + good[: len(good) // 2])  # + a torn last line
    assert tiers.fetch_state(KEY, None, 0, 99)[:2] == (21, 21)
    listing.write_bytes(b"not a list at all")
    assert tiers.fetch_state(KEY, None, 0, 99) is None
    assert tiers.disk.stats.corrupt == 0 and not caplog.records  # no warning: just misses


def test_a_crash_between_the_line_and_the_file_is_a_miss_then_heals(tmp_path):
    """The line goes first: a crash before the state's file leaves a line naming nothing."""
    tiers = open_tiers(tmp_path)
    keep(tiers, KEY, [13])
    state = tiers.disk._path(kv_tiers.state_digest(chain(KEY, None, CHUNK)[0], KEY[8:13]))
    state.unlink()
    tiers.close([])
    tiers = open_tiers(tmp_path)  # the restart after the crash
    assert tiers.fetch_state(KEY, None, 0, 99) is None
    keep(tiers, KEY, [13])  # demoted again: found again
    assert tiers.fetch_state(KEY, None, 0, 99)[:2] == (13, 13)


def test_a_damaged_state_is_skipped_with_one_warning_for_the_next_deepest(tmp_path, caplog):
    tiers = open_tiers(tmp_path)
    keep(tiers, KEY, [9, 40])
    path = tiers.disk._path(kv_tiers.state_digest(chain(KEY, None, CHUNK)[4], KEY[40:40]))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert tiers.fetch_state(KEY, None, 0, 99)[:2] == (9, 9)
    warnings = [r for r in caplog.records if "skipping and deleting" in r.getMessage()]
    assert len(warnings) == 1 and tiers.disk.stats.corrupt == 1


def test_a_state_the_runner_refuses_is_a_miss(tmp_path, caplog):
    tiers = open_tiers(tmp_path)
    keep(tiers, KEY, [9])
    tiers.states = FakeStates()
    tiers.states.adopt = lambda data, tokens: (_ for _ in ()).throw(ValueError("not ours"))
    assert tiers.fetch_state(KEY, None, 0, 99) is None
    assert "not resuming from a state (not ours)" in caplog.text


def test_states_spilled_from_host_to_disk_are_still_found(tmp_path):
    tiers = open_tiers(tmp_path, host=True)
    tiers.host.budget = 60  # room for two 24-byte states: the oldest spill to disk
    keep(tiers, KEY, [3, 11, 19, 27, 35])
    tiers.disk.flush()
    assert tiers.host.count == 2
    for end in (35, 27, 19, 11, 3):
        assert tiers.fetch_state(KEY, None, 0, end)[:2] == (end, end)


def test_the_host_index_stays_proportional_to_what_the_tier_holds():
    held: set[bytes] = set()
    index = StateIndex(held.__contains__)
    root = root_digest(None)
    for i in range(10_000):
        digest = i.to_bytes(16, "little")
        held.add(digest)
        held.discard((i - 10).to_bytes(16, "little", signed=True))  # it keeps the newest ten
        index.add(root, digest, i % CHUNK)
    assert len(index) <= 128 and len(index.get(root)) == len(index)
    assert (9999).to_bytes(16, "little") in dict(index.get(root))


def test_state_lists_are_budgeted_and_cleared_with_the_chunks(tmp_path):
    tiers = open_tiers(tmp_path)
    keep(tiers, KEY, [5, 13])
    tiers.close([])
    lists = list(tiers.disk.folder.rglob("*" + STATES_SUFFIX))
    stored = [p for p in tiers.disk.folder.rglob("*") if p.suffix in (".kv", STATES_SUFFIX)]
    size = sum(p.stat().st_size for p in stored)
    assert len(lists) == 2 and len(stored) == 4
    reopened = open_tiers(tmp_path)
    assert reopened.disk.used_bytes == size
    reopened.close([])
    assert clear_stored(tmp_path / "kv") == size
    assert not list((tmp_path / "kv").rglob("*" + STATES_SUFFIX))
