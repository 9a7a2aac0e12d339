"""Backend tests reuse the engine tests' tiny random-weight models and transformers references."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_test_module(relative: str):
    """A module of tests/ (e.g. "engine/conftest.py"), loaded by path: works with any pytest
    import mode, and with `tests/sched` shadowed by the standard library's `sched`."""
    name = "_localradix_test_helpers_" + relative.replace("/", "_").removesuffix(".py")
    if name not in sys.modules:
        path = Path(__file__).resolve().parent.parent / relative
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_helpers = load_test_module("engine/conftest.py")
VOCAB: int = _helpers.VOCAB
tiny_model = _helpers.tiny_model
hf_greedy = _helpers.hf_greedy
bundled_gguf = _helpers.bundled_gguf
random_prompts = _helpers.random_prompts
token_lists = _helpers.token_lists


HAS_MLX: bool = _helpers.HAS_MLX
requires_mlx = _helpers.requires_mlx
BACKENDS = _helpers.BACKENDS
HAS_LLAMA_CPP: bool = importlib.util.find_spec("llama_cpp") is not None
