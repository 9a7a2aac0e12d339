"""What model-listing clients (Ollama's /api/tags, /api/show, /api/ps) want to know about the
served model: file size, digest, family, parameter size, quantization and `model_info` keys.

Read once from the GGUF header or the Hugging Face folder's config.json (no tensors loaded).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# llama.cpp's LLAMA_FTYPE values (GGUF `general.file_type`) -> Ollama's quantization_level.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
}  # fmt: skip
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
HF_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


@dataclass(frozen=True)
class ModelFacts:
    name: str
    size: int  # bytes on disk
    modified: float  # Unix time
    digest: str  # sha256 hex (of the path, size and time: stable while the file is)
    format: str  # "gguf" | "safetensors"
    family: str  # GGUF general.architecture or HF model_type, e.g. "llama"
    parameter_size: str  # "135M", "7.6B"
    quantization_level: str  # "Q4_1", "BF16"
    license: str = ""
    model_info: dict[str, Any] = field(default_factory=dict)

    def details(self) -> dict[str, Any]:
        """Ollama's `details` object (every field: some clients reject a model missing one)."""
        return {
            "parent_model": "",
            "format": self.format,
            "family": self.family,
            "families": [self.family],
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization_level,
        }


@functools.lru_cache(maxsize=32)
def model_facts(name: str, path: str, context_length: int, architecture: str) -> ModelFacts:
    """The served model's facts (cached: the header is read once)."""
    source = Path(path)
    files = [source] if source.is_file() else sorted(source.glob("*")) if source.is_dir() else []
    stats = [f.stat() for f in files if f.is_file()]
    size = sum(s.st_size for s in stats)
    modified = max((s.st_mtime for s in stats), default=0.0)
    digest = hashlib.sha256(f"{source.resolve()}:{size}:{modified}".encode()).hexdigest()
    if source.is_file() and source.suffix == ".gguf":
        facts = _gguf(source, name, context_length)
    else:
        facts = _hf(source, name, context_length, architecture, size)
    return ModelFacts(name, size, modified, digest, **facts)


def _gguf(path: Path, name: str, context_length: int) -> dict[str, Any]:
    from localradix.gguf_file import read_gguf

    meta = read_gguf(path, tensors=False).metadata
    arch = str(meta.get("general.architecture", "llama"))
    info = {
        k: v
        for k, v in meta.items()
        if (k.startswith("general.") or k.startswith(f"{arch}.")) and not isinstance(v, list)
    }
    info.setdefault("general.basename", name)
    info[f"{arch}.context_length"] = context_length  # what this server serves, not the file's
    count = info.get("general.parameter_count")
    label = meta.get("general.size_label") or (_size_label(count) if count else "unknown")
    return {
        "format": "gguf",
        "family": arch,
        "parameter_size": str(label),
        "quantization_level": FILE_TYPES.get(int(meta.get("general.file_type", -1)), "unknown"),
        "license": str(meta.get("general.license", "")),
        "model_info": info,
    }


def _hf(path: Path, name: str, context_length: int, architecture: str, size: int) -> dict[str, Any]:
    config: dict[str, Any] = {}
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        pass
    arch = str(config.get("model_type") or architecture.removesuffix("ForCausalLM").lower())
    arch = arch or "unknown"
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    weights = sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir() else 0
    count = weights // DTYPE_BYTES.get(dtype, 2) if weights else 0
    info: dict[str, Any] = {
        "general.architecture": arch,
        "general.basename": name,
        f"{arch}.context_length": context_length,
    }
    if count:
        info["general.parameter_count"] = count
    for ours, theirs in (
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("vocab_size", "vocab_size"),
    ):
        if isinstance(config.get(theirs), int):
            info[f"{arch}.{ours}"] = config[theirs]
    return {
        "format": "safetensors",
        "family": arch,
        "parameter_size": _size_label(count) if count else "unknown",
        "quantization_level": HF_DTYPES.get(dtype, dtype.upper()),
        "model_info": info,
    }


def _size_label(count: int) -> str:
    """Ollama's parameter_size: "135M", "7.6B"."""
    if count >= 1_000_000_000:
        return f"{count / 1e9:.1f}B"
    return f"{max(1, round(count / 1e6))}M"
