"""The wheel users get from `pip install localradix`: built from this tree, installed into a
fresh venv, it holds every file the package reads (not only *.py) and serves the bundled model.

The fresh venv gets the wheel alone (`--no-deps`); its dependencies are borrowed from this
test's environment through a `.pth` line, which adds that site-packages as a plain path, so
the editable install of this checkout stays invisible and `localradix` comes from the wheel.
"""

from __future__ import annotations

import json
import os
import site
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-w", str(out), str(REPO)], check=True, cwd=out)
    (path,) = out.glob("localradix-*-py3-none-any.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    subprocess.run([*install, "--no-deps", str(wheel)], check=True)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    deps = "\n".join(site.getsitepackages())
    Path(purelib, "borrowed-deps.pth").write_text(deps + "\n")
    return root


def test_the_wheel_holds_every_file_the_package_reads(wheel: Path) -> None:
    """Every non-Python file under localradix/ in git (stylesheets, templates) is packaged."""
    tracked = subprocess.run(
        ["git", "ls-files", "localradix"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    data = {p for p in tracked if not p.endswith(".py")}
    names = set(zipfile.ZipFile(wheel).namelist())
    assert data, "expected the TUI stylesheet at least"
    assert data <= names, f"missing from the wheel: {sorted(data - names)}"


def test_the_installed_wheel_serves_the_bundled_model(venv: Path) -> None:
    python, cli = venv / "bin" / "python", venv / "bin" / "localradix"
    where = subprocess.run(
        [str(python), "-c", "import localradix, sys; print(localradix.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=venv,
    ).stdout
    assert where.startswith(str(venv)), f"localradix came from {where}, not the wheel"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = [str(cli), "serve", "--port", str(port), "--max-total-tokens", "4096"]
    log = venv / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=venv)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, url, log)
        body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        reply = httpx.post(url + "/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert json.loads(reply.text)["usage"]["completion_tokens"] == 4
    finally:
        proc.terminate()
        proc.wait(60)


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"serve not healthy after {timeout}s:\n{log.read_text()}")
