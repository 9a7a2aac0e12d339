"""llama.cpp's sequence state blob <-> token rows (the cache tiers' format), both V layouts."""

from __future__ import annotations

import numpy as np
import pytest

from localradix.backends.llamacpp.cell_blob import BlobError, CellLayout

MAGIC = 0xAF143CD8


@pytest.mark.parametrize("v_trans", [False, True])
def test_rows_round_trip_through_a_blob(v_trans):
    rng = np.random.default_rng(0)
    k_rows, v_rows = (24, 40, 8), (12, 20, 4)
    elems = tuple((2, w // 2) for w in v_rows) if v_trans else ()
    layout = CellLayout(MAGIC, v_trans, (1, 1, 8), k_rows, (1, 1, 8), v_rows, elems)
    positions = np.array([64, 65, 66, 67, 68], dtype=np.int64)
    rows = rng.integers(0, 256, (5, layout.bytes_per_token), dtype=np.uint8)
    blob = layout.build(positions, rows, seq=255).tobytes()
    parsed, got_positions, got_rows = CellLayout.parse(blob)
    assert parsed == layout
    assert np.array_equal(got_positions, positions) and np.array_equal(got_rows, rows)
    # A token's row is its K of every layer, then its V of every layer: in the blob, with
    # v_trans, V is stored column by column across the cells instead.
    first_v = rows[0, sum(k_rows) : sum(k_rows) + v_rows[0]].tobytes()
    assert (blob.find(first_v) >= 0) != v_trans
    in_parts = layout.build(positions, [rows[:2], rows[2:3], rows[3:]], seq=255).tobytes()
    assert in_parts == blob


def test_what_is_not_one_plain_stream_is_refused():
    layout = CellLayout(MAGIC, False, (1,), (4,), (1,), (4,))
    blob = layout.build(np.arange(3), np.zeros((3, 8), np.uint8)).tobytes()
    with pytest.raises(BlobError, match="ends early"):
        CellLayout.parse(blob[:-1])
    with pytest.raises(BlobError, match="past the end"):
        CellLayout.parse(blob + b"\0")
    two_streams = blob[:8] + (2).to_bytes(4, "little") + blob[12:]
    with pytest.raises(BlobError, match="more than one KV stream"):
        CellLayout.parse(two_streams)


def test_a_sliding_window_blob_carries_both_parts_in_each_row():
    """Full-attention layers' cells, then the sliding-window layers' (the same positions)."""
    rng = np.random.default_rng(1)
    swa = CellLayout(MAGIC, False, (1,), (16,), (1,), (16,))
    layout = CellLayout(MAGIC, False, (1, 1), (8, 8), (1, 1), (8, 8), then=swa)
    assert layout.bytes_per_token == 32 + 32
    positions = np.arange(10, 14, dtype=np.int64)
    rows = rng.integers(0, 256, (4, layout.bytes_per_token), dtype=np.uint8)
    blob = layout.build(positions, [rows[:1], rows[1:]], seq=3).tobytes()
    parsed, got_positions, got_rows = CellLayout.parse(blob)
    assert parsed == layout
    assert np.array_equal(got_positions, positions) and np.array_equal(got_rows, rows)
    # The sliding-window part starts after the full part: its K is the row's bytes 32..48.
    assert blob.find(rows[0, 32:48].tobytes()) > blob.find(rows[3, 16:24].tobytes()) > 0
    full = CellLayout(MAGIC, False, (1, 1), (8, 8), (1, 1), (8, 8))
    alone = full.build(positions, rows[:, :32], seq=3).tobytes()
    assert blob.startswith(alone) and len(blob) > len(alone)  # the full part comes first
    shifted = swa.build(positions + 1, rows[:, 32:], seq=3).tobytes()[8:]  # past magic and id
    with pytest.raises(BlobError, match="other cells"):
        CellLayout.parse(alone + shifted)
