"""Open the cache tiers under the radix tree for one model: host memory and disk.

The disk tier's folder is per model fingerprint: the weights file(s) (name, size, and the
bytes at both ends, which hold a GGUF's metadata and a sample of its tensors), the backend,
the weight and KV dtypes, the KV layout, the page size and localradix's version. Anything that
changes what KV a token gets changes the fingerprint, so a different model, quantization,
backend or release never reads another's KV. The tensor-parallel size is not in it: a TP
runner's rows hold every rank's heads in model order, as tp=1's (`runner/tp/kv_transfer.py`),
and differ from them only by summation order, as the attention kernels' do.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import time
from pathlib import Path
from typing import Any

from localradix.config import ServerArgs
from localradix.mem.disk_tier import DiskTier
from localradix.mem.host_tier import HostTier
from localradix.mem.kv_chunks import chunk_size
from localradix.mem.kv_tiers import KVTiers
from localradix.mem.tier_settings import GIB, disk_tier_settings
from localradix.resolve import Target
from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.engine")

SAMPLE_BYTES = 1 << 20  # read at each end of every weights file
WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".bin", ".npz", ".pt")


def _version() -> str:
    try:
        return importlib.metadata.version("localradix")
    except importlib.metadata.PackageNotFoundError:  # a source checkout run in place
        return "source"


def open_tiers(
    args: ServerArgs, source: ModelSource, target: Target, runner: Any, config: Any
) -> KVTiers | None:
    """The tiers `args` ask for, or None (asked for none, or the runner cannot copy KV out)."""
    disk = disk_tier_settings(args.kv_disk_cache, args.kv_disk_gib)
    host_bytes = int(args.kv_host_gib * GIB)
    if args.disable_radix_cache or (not disk.on and host_bytes <= 0):
        return None
    kv = runner.kv_transfer
    if kv is None:
        logger.info(
            "KV cache tiers (host memory, disk): not available on the %s backend; cached "
            "prefixes live in memory only",
            target.backend,
        )
        return None
    parts = {
        # A new version may compute KV differently (a loader or kernel fix): it starts afresh.
        "localradix": _version(),
        "architecture": getattr(config, "architecture", ""),
        "backend": target.backend,
        "dtype": target.dtype,
        "kv_dtype": target.cache_dtype,
        "kv_bytes_per_token": kv.bytes_per_token,
        "page_size": args.page_size,
    }
    disk_tier = None
    if disk.on:
        assert disk.folder is not None
        fingerprint = model_fingerprint(weight_files(source.path), parts)
        model = {"name": source.name, "path": str(source.path), **parts, "opened": time.time()}
        try:
            disk_tier = DiskTier(disk.folder, fingerprint, disk.budget_bytes, model)
        except OSError as exc:
            logger.warning("KV disk cache off: cannot use %s (%s)", disk.folder, exc)
        else:
            logger.info(
                "KV disk cache: %s, %.1f of %.1f GiB used (%s); --kv-disk-cache off turns it off",
                disk_tier.folder, disk_tier.used_bytes / GIB, disk.budget_bytes / GIB, disk.why,
            )  # fmt: skip
    host = HostTier(host_bytes) if host_bytes > 0 else None
    if host is not None:
        logger.info("KV host-memory tier: %.1f GiB", host_bytes / GIB)
    if host is None and disk_tier is None:
        return None
    return KVTiers(kv, chunk_size(args.page_size), host, disk_tier, page=args.page_size)


def weight_files(path: Path) -> list[Path]:
    """The files whose bytes are the model: a GGUF, or a folder's config and weights."""
    if path.is_file():
        return [path]
    files = [p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES or p.name == "config.json"]
    return sorted(files)


def model_fingerprint(files: list[Path], parts: dict[str, Any]) -> str:
    digest = hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=12)
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as f:
            digest.update(f.read(SAMPLE_BYTES))
            if size > 2 * SAMPLE_BYTES:
                f.seek(size - SAMPLE_BYTES)
                digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()
