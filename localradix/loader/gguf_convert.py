"""GGUF weights for the torch runners: dequantized straight from the file, or via a cache.

Config and tokenizer files are derived once into a cache folder (`$LOCALRADIX_CACHE_DIR` or
`~/.cache/localradix`, under `gguf/<stem>-<key>`, key = hash of path + size + mtime + format
version): config.json, tokenizer.json, tokenizer_config.json, generation_config.json. They are
cheap and written by whoever needs them first (the API process).

The weights (dequantized, with llama.cpp's converter's changes undone: `gguf_tensors`) of models up to
DIRECT_LOAD_MAX_PARAMS are read straight from the GGUF at every start: the bundled 135M model
dequantizes in about a second, where a float32 copy would take 515 MB of disk. Bigger models are
converted once into the cache folder's model.safetensors (16-bit past FLOAT32_CACHE_MAX_PARAMS),
streamed tensor by tensor under a progress bar, since dequantizing them would slow every start.
Every file is written to a temporary name and renamed, so concurrent processes never see half a
file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from localradix.gguf_file import GGUFFile, read_gguf
from localradix.paths import cache_root

if TYPE_CHECKING:
    from localradix.loader.gguf_tensors import HFTensor

CACHE_FORMAT = 1
WEIGHTS_FILE = "model.safetensors"
# Models up to this many parameters load straight from the GGUF (no converted copy on disk).
DIRECT_LOAD_MAX_PARAMS = 1_000_000_000
# Quantized tensors of models up to this many parameters are cached in float32 (exact);
# larger ones in float16, to keep the cache (and the loading RAM) at 2 bytes per weight.
FLOAT32_CACHE_MAX_PARAMS = 2_000_000_000


def cache_dir_for(gguf_path: Path) -> Path:
    path = Path(gguf_path).resolve()
    stat = path.stat()
    key = f"{CACHE_FORMAT}|{path}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{path.stem}-{digest}"


def ensure_gguf_tokenizer(gguf_path: Path) -> Path:
    """The cache folder with config and tokenizer files (no weights) for this GGUF."""
    folder = cache_dir_for(gguf_path)
    if not (folder / "tokenizer.json").is_file() or not (folder / "config.json").is_file():
        _write_metadata_files(folder, read_gguf(gguf_path))
    return folder


def needs_converted_copy(gguf_path: Path) -> bool:
    """Whether the torch runners load this GGUF via a converted copy (big models only)."""
    return _total_params(read_gguf(gguf_path)) > DIRECT_LOAD_MAX_PARAMS


def iter_gguf_weights(gguf_path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, float32 array) of every weight, dequantized from the GGUF one at a time."""
    for tensor in _hf_tensors(read_gguf(gguf_path)):
        array = tensor.load()
        # float32 tensors come back as views of the read-only map: the model owns a copy.
        yield tensor.name, array if array.flags.writeable else array.copy()


def ensure_gguf_model(gguf_path: Path) -> Path:
    """The cache folder with everything, converting the weights on first use."""
    folder = cache_dir_for(gguf_path)
    if (folder / WEIGHTS_FILE).is_file() and (folder / "config.json").is_file():
        return folder
    gguf = read_gguf(gguf_path)
    if not (folder / "config.json").is_file():
        _write_metadata_files(folder, gguf)
    _write_weights(folder / WEIGHTS_FILE, gguf, Path(gguf_path).name)
    return folder


def _write_metadata_files(folder: Path, gguf: GGUFFile) -> None:
    from localradix.loader.gguf_metadata import eos_token_ids, hf_config
    from localradix.loader.gguf_tokenizer import build_gguf_tokenizer

    meta = gguf.metadata
    tensors = {t.name: t for t in gguf.tensors}
    config = hf_config(meta, set(tensors), lambda name: tensors[name].dequantize())
    tokenizer, tokenizer_config = build_gguf_tokenizer(meta)
    folder.mkdir(parents=True, exist_ok=True)
    _atomic_write(folder / "tokenizer.json", tokenizer.to_str().encode())
    _write_json(folder / "tokenizer_config.json", tokenizer_config)
    _write_json(folder / "generation_config.json", {"eos_token_id": eos_token_ids(meta)})
    _write_json(folder / "config.json", config)  # last: its presence marks the set complete


def _write_weights(path: Path, gguf: GGUFFile, label: str) -> None:
    from tqdm import tqdm

    tensors = _hf_tensors(gguf)
    total = sum(t.n_elements for t in tensors)
    plan = [(t, _cache_dtype(t.qtype, total)) for t in tensors]
    header = _safetensors_header(plan)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    bar = tqdm(total=total, unit="w", unit_scale=True, desc=f"Converting {label} (first run)")
    try:
        with open(tmp, "wb") as f, bar:
            f.write(header)
            for t, dtype in plan:
                array = t.load()
                f.write(np.ascontiguousarray(array, dtype=dtype).tobytes())
                bar.update(t.n_elements)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left behind when the conversion failed


def _hf_tensors(gguf: GGUFFile) -> list[HFTensor]:
    """The Hugging Face parameters the model loads, each with its GGUF source tensors."""
    from localradix.loader.gguf_tensors import tensor_plan

    return tensor_plan(gguf)


def _total_params(gguf: GGUFFile) -> int:
    return sum(t.n_elements for t in _hf_tensors(gguf))


def _cache_dtype(qtype: int, total_params: int) -> np.dtype:
    from gguf import GGMLQuantizationType as Q

    if qtype == Q.F16:
        return np.dtype(np.float16)
    if qtype == Q.F32 or total_params <= FLOAT32_CACHE_MAX_PARAMS:
        return np.dtype(np.float32)
    return np.dtype(np.float16)  # BF16 and quantized tensors of big models


def _safetensors_header(plan: list[tuple[HFTensor, np.dtype]]) -> bytes:
    """The safetensors header for tensors written back to back in `plan` order."""
    codes = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}
    entries: dict[str, Any] = {"__metadata__": {"format": "pt", "source": "gguf"}}
    offset = 0
    for t, dtype in plan:
        shape = [int(d) for d in t.shape]
        size = int(np.prod(shape)) * dtype.itemsize
        entries[t.name] = {
            "dtype": codes[dtype],
            "shape": shape,
            "data_offsets": [offset, offset + size],
        }
        offset += size
    body = json.dumps(entries, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)  # data starts 8-byte aligned
    return len(body).to_bytes(8, "little") + body


def _write_json(path: Path, value: Any) -> None:
    _atomic_write(path, json.dumps(value, indent=2, ensure_ascii=False).encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
