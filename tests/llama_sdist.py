"""llama.cpp's source tree, as vendored by the installed llama-cpp-python's sdist.

The tokenizer test vectors (`models/ggml-vocab-*.gguf` + `.inp`/`.out`), the real chat templates
(`models/templates/*.jinja`) and the HF -> GGUF converter (`convert_hf_to_gguf.py` with its
in-tree `gguf-py`) all come from the llama.cpp that the installed llama-cpp-python compiled, so
the references match the library under test. The sdist is downloaded from PyPI once (pip) and
unpacked under the cache folder (`$LOCALRADIX_CACHE_DIR`, else `~/.cache/localradix`); set
`LOCALRADIX_LLAMA_SDIST` to an unpacked `vendor/llama.cpp` folder to use one at hand.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path


def llama_version() -> str | None:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def cache_root() -> Path:
    configured = os.environ.get("LOCALRADIX_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "localradix"


def llama_cpp_tree() -> Path:
    """The `vendor/llama.cpp` folder of the installed llama-cpp-python's sdist."""
    given = os.environ.get("LOCALRADIX_LLAMA_SDIST")
    if given:
        return Path(given)
    version = llama_version()
    if version is None:
        raise RuntimeError("llama-cpp-python is not installed")
    root = cache_root() / "llama-sdist"
    tree = root / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:  # pytest-xdist or two sessions: one download
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (tree / "convert_hf_to_gguf.py").is_file():
            _download_and_unpack(version, root)
    return tree


def _download_and_unpack(version: str, root: Path) -> None:
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={version}", "-d", tmp],
            check=True,
        )  # fmt: skip
        (archive,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
