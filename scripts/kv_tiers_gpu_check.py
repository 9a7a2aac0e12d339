#!/usr/bin/env python
"""GPU check of the cache tiers' KV copies (`localradix/runner/kv_copy.py`): pinned host memory
and asynchronous copies.

    python scripts/kv_tiers_gpu_check.py [--device cuda] [--mib 256] [--json out.json]
    python scripts/kv_tiers_gpu_check.py --device cpu --mib 8     # the same steps, synchronous

1. Round trip: a KV pool of about `--mib` MiB on the device; every slot's rows go to host
   memory (`TorchKVTransfer.read_async`: a side stream into pinned memory on CUDA) and back
   into a zeroed pool (`write`: staged in pinned memory, copied on the compute stream); the
   bytes must come back equal, and a read in flight must keep the bytes its slots had when it
   started although the next "step" overwrites them at once.
2. Bandwidth: device to host and host to device, GB/s (median of `--repeats`).
3. Overlap: wall time of a device-to-host copy plus a matmul sized to take about as long, run
   one after the other and then together (copy on the side stream, matmul on the compute
   stream); and how soon a promotion's `write` hands control back to the host compared with
   when its copy is done. On a CPU the copies are synchronous: no overlap is expected.
Exit status 1 if bytes differ. Results go to `--json`, or $OUT/kv_tiers_gpu_check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from localradix.runner.kv_transfer import TorchKVTransfer  # noqa: E402

LAYERS, HEADS, DIM = 16, 8, 128  # a small model's KV: 2 x 16 x 8 x 128 x 2 bytes a token


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn, repeats: int) -> float:
    """Median seconds of `fn()` to completion on the device."""
    times = []
    for _ in range(repeats):
        sync(device)
        started = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def kv_pool(device: torch.device, mib: int) -> TorchKVTransfer:
    per_token = 2 * LAYERS * HEADS * DIM * 2
    slots = max(mib * 2**20 // per_token, 8)
    shape = (LAYERS, slots + 1, HEADS, DIM)
    gen = torch.Generator(device=device).manual_seed(0)
    k = torch.randn(shape, dtype=torch.bfloat16, device=device, generator=gen)
    return TorchKVTransfer(
        k, torch.randn(shape, dtype=torch.bfloat16, device=device, generator=gen)
    )


def round_trip(kv: TorchKVTransfer) -> dict:
    device = kv.device
    k, v = kv.groups[0]
    slots = np.random.default_rng(0).permutation(np.arange(1, k.shape[1]))
    first = slots[:64]
    pending = kv.read_async(slots)
    snapshot, originals = kv.rows(first).cpu(), k[:, first].clone()
    inflight = kv.read_async(first)
    k[:, first] = 0  # the next step reuses the slots at once
    kept = torch.equal(torch.from_numpy(inflight.result()), snapshot)
    rows = pending.result()
    k[:, first] = originals
    fresh = TorchKVTransfer(torch.zeros_like(k), torch.zeros_like(v))
    parts = np.array_split(rows, max(len(rows) // 4096, 1))
    fresh.write(np.array([], dtype=np.int64), slots, parts)
    sync(device)
    fk, fv = fresh.groups[0]
    equal = torch.equal(fk[:, 1:], k[:, 1:]) and torch.equal(fv[:, 1:], v[:, 1:])
    return {"bytes_equal": bool(equal), "inflight_kept": bool(kept), "tokens": len(slots)}


def bandwidth(kv: TorchKVTransfer, repeats: int) -> dict:
    device = kv.device
    slots = np.arange(1, kv.groups[0][0].shape[1])
    gathered = kv.rows(slots)
    host = kv.copies.to_host(gathered).result()
    nbytes = host.nbytes
    d2h = timed(device, lambda: kv.copies.to_host(gathered).result(), repeats)
    h2d = timed(device, lambda: kv.copies.to_device(host, device), repeats)
    return {"mib": nbytes / 2**20, "d2h_gbps": nbytes / d2h / 1e9, "h2d_gbps": nbytes / h2d / 1e9}


def overlap(kv: TorchKVTransfer, repeats: int) -> dict:
    device = kv.device
    gathered = kv.rows(np.arange(1, kv.groups[0][0].shape[1]))
    copy_s = timed(device, lambda: kv.copies.to_host(gathered).result(), repeats)
    size = 1024
    a = torch.randn(size, size, device=device)
    one = timed(device, lambda: a @ a, repeats)
    count = max(int(copy_s / max(one, 1e-6)), 1)  # matmuls that take about as long as the copy

    def compute() -> None:
        for _ in range(count):
            a @ a

    def serial() -> None:
        kv.copies.to_host(gathered).result()
        compute()

    def together() -> None:
        pending = kv.copies.to_host(gathered)
        compute()
        pending.result()

    serial_s, together_s = timed(device, serial, repeats), timed(device, together, repeats)
    host = kv.copies.to_host(gathered).result()
    parts = np.array_split(host, 8)
    slots = np.arange(1, len(host) + 1)
    sync(device)
    started = time.perf_counter()
    kv.write(np.array([], dtype=np.int64), slots, parts)
    returned = time.perf_counter() - started
    sync(device)
    landed = time.perf_counter() - started
    return {
        "copy_s": copy_s,
        "matmuls": count,
        "serial_s": serial_s,
        "together_s": together_s,
        "overlap_gain": serial_s / together_s,
        "write_returns_s": returned,
        "write_lands_s": landed,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--mib", type=int, default=256, help="size of the KV pool copied")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    kv = kv_pool(device, args.mib)
    result = {"device": str(device), "copies": type(kv.copies).__name__, "torch": torch.__version__}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    result["round_trip"] = round_trip(kv)
    result["bandwidth"] = bandwidth(kv, args.repeats)
    result["overlap"] = overlap(kv, args.repeats)
    rt, bw, ov = result["round_trip"], result["bandwidth"], result["overlap"]
    print(f"device {result['device']} ({result.get('gpu', 'cpu')}), copies: {result['copies']}")
    print(f"round trip of {rt['tokens']} tokens: bytes equal {rt['bytes_equal']}, "
          f"read in flight kept its bytes {rt['inflight_kept']}")  # fmt: skip
    print(f"bandwidth over {bw['mib']:.0f} MiB: device->host {bw['d2h_gbps']:.2f} GB/s, "
          f"host->device {bw['h2d_gbps']:.2f} GB/s")  # fmt: skip
    print(f"overlap: copy {ov['copy_s'] * 1e3:.1f} ms + {ov['matmuls']} matmuls: serial "
          f"{ov['serial_s'] * 1e3:.1f} ms, together {ov['together_s'] * 1e3:.1f} ms "
          f"({ov['overlap_gain']:.2f} x)")  # fmt: skip
    print(f"promotion write: returns after {ov['write_returns_s'] * 1e3:.1f} ms, "
          f"lands after {ov['write_lands_s'] * 1e3:.1f} ms")  # fmt: skip
    out = args.json or (os.path.join(os.environ["OUT"], "kv_tiers_gpu_check.json")
                        if os.environ.get("OUT") else None)  # fmt: skip
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    ok = rt["bytes_equal"] and rt["inflight_kept"]
    print("PASS" if ok else "FAIL: KV bytes differ after the round trip")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
