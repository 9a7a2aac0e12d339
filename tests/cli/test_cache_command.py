"""`localradix cache` and `localradix cache clear`, through the real CLI, on a store a real
DiskTier wrote (two models), as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localradix.cache_command import age, human_bytes
from localradix.mem.disk_tier import DiskTier, stored_models
from localradix.mem.kv_chunks import KVChunk, chain, root_digest

REPO = Path(__file__).resolve().parents[2]
CHUNK = 4  # tokens per chunk (the tier does not care how many)
WIDTH = 64  # KV bytes per token
MODELS = {  # fingerprint -> (model.json, chunks stored)
    "aaaa1111bbbb2222cccc3333": (
        {"name": "SmolLM2-135M-Instruct", "backend": "cpu", "dtype": "bfloat16"},
        3,
    ),
    "dddd4444eeee5555ffff6666": ({"name": "qwen3:0.6b", "backend": "cuda", "dtype": "float16"}, 2),
}


def chunks(count: int, seed: int) -> list[KVChunk]:
    """`count` valid chunks of one prompt: their digests are its chained digests."""
    key = np.arange(seed, seed + count * CHUNK, dtype=np.int64)
    digests = chain(key, None, CHUNK)
    parents = [root_digest(None), *digests[:-1]]
    data = np.full((CHUNK, WIDTH), seed % 256, dtype=np.uint8)
    return [
        KVChunk(digests[i], parents[i], key[i * CHUNK : (i + 1) * CHUNK].copy(), data)
        for i in range(count)
    ]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "kv"
    for seed, (fingerprint, (model, count)) in enumerate(MODELS.items()):
        tier = DiskTier(root, fingerprint, 1 << 30, model)
        for chunk in chunks(count, 1000 * seed):
            assert tier.put(chunk)
        tier.close()
    return root


def localradix(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localradix", *args],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )  # fmt: skip


def kv_files(root: Path, fingerprint: str) -> list[Path]:
    return sorted((root / fingerprint).rglob("*.kv"))


def test_ls_shows_each_model_and_the_total(store: Path):
    r = localradix("cache", "--kv-disk-cache", str(store), "--kv-disk-gib", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    size = sum(m.bytes for m in stored_models(store))
    assert (
        lines[0] == f"KV disk cache: {store}, {human_bytes(size)} used of 2.0 GiB (2 GiB asked for)"
    )
    assert lines[2].split() == ["NAME", "BACKEND", "DTYPE", "FILES", "SIZE", "LAST", "USED",
                                "FINGERPRINT"]  # fmt: skip
    rows = {line.split()[0]: line for line in lines[3:6]}
    smol = rows["SmolLM2-135M-Instruct"].split()
    assert smol[1:4] == ["cpu", "bfloat16", "3"] and smol[-1] == "aaaa1111bbbb2222cccc3333"
    assert "just now" in rows["SmolLM2-135M-Instruct"]
    assert rows["qwen3:0.6b"].split()[1:4] == ["cuda", "float16", "2"]
    assert rows["total"].split() == ["total", "5", *human_bytes(size).split()]
    assert "`localradix cache clear [MODEL]`" in r.stdout
    # `cache ls` is the same, and the folder may come from the environment
    again = localradix("cache", "ls", "--kv-disk-gib", "2",
                       env={"LOCALRADIX_KV_DISK_CACHE": str(store)})  # fmt: skip
    assert again.returncode == 0 and again.stdout == r.stdout


def test_ls_json(store: Path):
    r = localradix("cache", "ls", "--json", "--kv-disk-cache", str(store), "--kv-disk-gib", "1")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["on"] and report["folder"] == str(store)
    assert report["budget_bytes"] == 2**30 and report["why"] == "1 GiB asked for"
    assert report["files"] == 5
    assert report["used_bytes"] == sum(m["bytes"] for m in report["models"]) > 0
    by_name = {m["name"]: m for m in report["models"]}
    smol = by_name["SmolLM2-135M-Instruct"]
    assert smol["fingerprint"] == "aaaa1111bbbb2222cccc3333"
    assert (smol["backend"], smol["dtype"], smol["files"]) == ("cpu", "bfloat16", 3)
    assert smol["last_used"] > 0
    # `--json` before the action works too
    assert (
        json.loads(localradix("cache", "--json", "--kv-disk-cache", str(store)).stdout)["files"]
        == 5
    )


def test_clear_one_model_by_name_or_fingerprint(store: Path):
    kept = kv_files(store, "aaaa1111bbbb2222cccc3333")
    stored = (store / "dddd4444eeee5555ffff6666").rglob("*")
    size = sum(p.stat().st_size for p in stored if p.suffix in (".kv", ".next"))
    r = localradix("cache", "clear", "QWEN3", "--kv-disk-cache", str(store))
    assert r.returncode == 0, r.stderr
    assert (
        r.stdout.strip() == f"freed {human_bytes(size)} in {store} (qwen3:0.6b {human_bytes(size)})"
    )
    assert kv_files(store, "dddd4444eeee5555ffff6666") == []
    assert kv_files(store, "aaaa1111bbbb2222cccc3333") == kept
    listed = localradix("cache", "--json", "--kv-disk-cache", str(store))
    assert [m["name"] for m in json.loads(listed.stdout)["models"]] == ["SmolLM2-135M-Instruct"]
    assert localradix("cache", "clear", "aaaa11", "--kv-disk-cache", str(store)).returncode == 0
    assert kv_files(store, "aaaa1111bbbb2222cccc3333") == []


def test_clear_everything(store: Path):
    size = sum(m.bytes for m in stored_models(store))
    r = localradix("cache", "--kv-disk-cache", str(store), "clear")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"freed {human_bytes(size)} in {store} (")
    assert list(store.rglob("*.kv")) == []
    assert "nothing stored in" in localradix("cache", "--kv-disk-cache", str(store)).stdout


def test_clear_of_an_unknown_model_refuses(store: Path):
    r = localradix("cache", "clear", "llama", "--kv-disk-cache", str(store))
    assert r.returncode == 2
    assert "no model matching 'llama' in the KV disk cache" in r.stderr
    assert "`localradix cache` lists them" in r.stderr
    assert len(list(store.rglob("*.kv"))) == 5


def test_off_and_empty_say_so_in_one_line(tmp_path: Path):
    off = localradix("cache", env={"LOCALRADIX_KV_DISK_CACHE": "off"})
    assert off.returncode == 0, off.stderr
    assert off.stdout.startswith("KV disk cache: off (--kv-disk-cache or $LOCALRADIX_KV_DISK_CACHE")
    assert "`localradix serve --kv-disk-cache DIR`" in off.stdout
    assert len(off.stdout.splitlines()) == 1
    assert localradix("cache", "clear", env={"LOCALRADIX_KV_DISK_CACHE": "off"}).stdout == (
        "KV disk cache: off (--kv-disk-cache or $LOCALRADIX_KV_DISK_CACHE says off): "
        "nothing to clear\n"
    )
    for folder in (tmp_path / "missing", tmp_path):  # a folder not made yet, or empty
        empty = localradix("cache", "--kv-disk-cache", str(folder), "--kv-disk-gib", "1")
        assert empty.returncode == 0, empty.stderr
        assert empty.stdout.splitlines() == [
            f"KV disk cache: nothing stored in {folder} yet (budget 1.0 GiB): `localradix serve` "
            "fills it with the KV its pool evicts and, at a graceful stop, all it has cached "
            "(torch, MLX and llama.cpp backends)"
        ]
    assert not (tmp_path / "missing").exists()  # looking creates nothing


def test_the_command_is_light_and_listed():
    code = (
        "import sys\nfrom localradix.cli import build_parser\n"
        "build_parser().parse_args(['cache', 'clear', 'x'])\n"
        "print(','.join(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and r.stdout.strip() == "", r.stderr + r.stdout


@pytest.mark.parametrize(
    "seconds, said",
    [(5, "just now"), (180, "3 min ago"), (7300, "2 h ago"), (86400, "1 day ago"),
     (3 * 86400 + 5, "3 days ago")],
)  # fmt: skip
def test_age(seconds: float, said: str):
    assert age(1000.0, now=1000.0 + seconds) == said
    assert age(0.0) == "-"


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 * 2**20, 3 * 2**30)] == [
        "0 B", "1023 B", "1.5 KiB", "5.0 MiB", "3.0 GiB"
    ]  # fmt: skip


def test_the_variable_named_is_the_one_read():
    from localradix import cache_command
    from localradix.mem import tier_settings

    assert cache_command.DIR_ENV == tier_settings.DIR_ENV
