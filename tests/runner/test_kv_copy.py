"""KV rows between device and host (`runner/kv_copy.py`): the synchronous CPU path, the order a
copy in flight keeps (its bytes are the slots' when it started, whatever later steps write
there; a write lands before the next read), and on a GPU the pinned asynchronous path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localradix.runner.kv_copy import CudaCopies, SyncCopies, copies_for
from localradix.runner.kv_transfer import TorchKVTransfer

LAYERS, SLOTS, HEADS, DIM = 3, 20, 2, 8
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))]  # fmt: skip


class Deferred:
    """A stand-in for an asynchronous copy engine on the CPU: a copy to the host happens only
    when its result is asked for, reading its source then (as a side stream would, later)."""

    pinned = False

    def __init__(self) -> None:
        self.sources: list[torch.Tensor] = []

    def to_host(self, rows: torch.Tensor) -> Deferred.Later:
        self.sources.append(rows)
        return Deferred.Later(rows)

    def to_device(self, data: np.ndarray, device: torch.device) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(data)).to(device)

    class Later:
        def __init__(self, source: torch.Tensor) -> None:
            self.source = source

        def done(self) -> bool:
            return False

        def result(self) -> np.ndarray:
            return self.source.cpu().numpy().copy()


def pool(device: str, page: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    shape = (LAYERS, (SLOTS + 1) // page, page, HEADS, DIM) if page > 1 else None
    k = torch.randn(shape or (LAYERS, SLOTS + 1, HEADS, DIM), device=device)
    return k, torch.randn_like(k)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_round_trip_through_the_devices_copy_engine(device):
    k, v = pool(device)
    kv = TorchKVTransfer(k, v)
    assert isinstance(kv.copies, CudaCopies if device == "cuda" else SyncCopies)
    slots = np.array([4, 9, 1, 17])
    rows = kv.read(slots)
    assert rows.shape == (4, kv.bytes_per_token) and rows.dtype == np.uint8
    fresh = TorchKVTransfer(torch.zeros_like(k), torch.zeros_like(v))
    fresh.write(np.array([], dtype=np.int64), slots, [rows[:1], rows[1:]])
    assert np.array_equal(fresh.read(slots), rows)
    assert torch.equal(fresh.groups[0][0][:, slots], k[:, slots])


@pytest.mark.parametrize("device", DEVICES)
def test_a_read_in_flight_keeps_the_bytes_the_slots_had_when_it_started(device):
    """Demotion frees the slots at once; the next step writes new KV there while the copy may
    still run: the copy must read a gathered snapshot, never the pool."""
    k, v = pool(device)
    deferred = Deferred() if device == "cpu" else None
    kv = TorchKVTransfer(k, v, copies=deferred)
    slots = np.array([2, 3, 5])
    expected = kv.read(slots)
    pending = kv.read_async(slots)
    kv.put_rows(slots, torch.zeros(3, kv.bytes_per_token, dtype=torch.uint8, device=device))
    k.add_(1)  # later steps write everywhere
    assert np.array_equal(pending.result(), expected)


def test_pinning_is_off_and_copies_finish_before_they_return_on_a_cpu():
    copies = copies_for("cpu")
    assert isinstance(copies, SyncCopies) and not copies.pinned
    rows = torch.arange(12, dtype=torch.uint8).view(3, 4)
    pending = copies.to_host(rows)
    assert pending.done() and np.array_equal(pending.result(), rows.numpy())


def test_a_write_lands_before_the_next_read_of_its_slots_paged():
    """Promotion, then the step reading those slots (here: a read), in order; paged caches
    ([layers, pages, page, heads, dim]) address the same slots."""
    k, v = pool("cpu", page=3)
    kv = TorchKVTransfer(k, v, copies=Deferred())
    slots = np.array([6, 7, 8, 12])
    before = kv.read(np.arange(SLOTS + 1))
    rows = np.random.default_rng(0).integers(0, 255, (4, kv.bytes_per_token), dtype=np.uint8)
    kv.write(np.array([], dtype=np.int64), slots, [rows[:2], rows[2:]])
    assert np.array_equal(kv.read_async(slots).result(), rows)
    others = np.setdiff1d(np.arange(SLOTS + 1), slots)
    assert np.array_equal(kv.read(others), before[others])


def test_the_gpu_check_script_runs_on_a_cpu(tmp_path):
    """scripts/kv_tiers_gpu_check.py --device cpu: the round trip, bandwidth and overlap steps
    a GPU session runs, synchronous here."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "kv_tiers_gpu_check.py"
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(script), "--device", "cpu", "--mib", "4", "--repeats", "1"]
    done = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bytes equal True, read in flight kept its bytes True" in done.stdout
    result = json.loads(out.read_text())
    assert result["copies"] == "SyncCopies" and result["round_trip"]["tokens"] == 64
    assert result["overlap"]["serial_s"] > 0 and result["bandwidth"]["d2h_gbps"] > 0
