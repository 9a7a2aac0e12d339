"""What `pip install 'localradix[mlx]'` resolves to on an Apple-silicon Mac, decided here on
Linux: pip evaluates environment markers for the machine it runs on (its `--platform` only
filters wheel tags), so the cross-platform resolution is uv's (`--python-platform`), from
pyproject.toml against PyPI. It must bring MLX with its Metal build and nothing CUDA/Linux-only.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINUX_ONLY = re.compile(r"^(nvidia-|cuda-|triton|mlx-cpu)", re.IGNORECASE)


def _resolve(platform: str, extra: str) -> list[str]:
    uv = pytest.importorskip("uv")
    cmd = [uv.find_uv_bin(), "pip", "compile", "pyproject.toml", "--extra", extra]
    cmd += ["--python-platform", platform, "--python-version", "3.11", "--no-header", "-q"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode and re.search(r"dns error|Connect|timed out", done.stderr):
        pytest.skip(f"PyPI unreachable: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    names = [line.split("==")[0] for line in done.stdout.splitlines() if "==" in line]
    return [n for n in names if not n.startswith(" ")]


def test_mlx_extra_on_apple_silicon_brings_metal_mlx_and_nothing_linux_only() -> None:
    names = _resolve("aarch64-apple-darwin", "mlx")
    assert {"mlx", "mlx-metal", "torch", "litestar"} <= set(names), names
    assert not [n for n in names if LINUX_ONLY.match(n)], names


def test_the_same_check_sees_cuda_on_linux() -> None:
    """The negative control: on x86-64 Linux the default torch does pull CUDA wheels."""
    names = _resolve("x86_64-unknown-linux-gnu", "cpu")
    assert [n for n in names if LINUX_ONLY.match(n)], names
