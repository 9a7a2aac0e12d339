"""Every "auto" setting is decided once, by `resolve`, from the chosen backend."""

from __future__ import annotations

import pytest

from localradix.config import ServerArgs
from localradix.platform import Availability, BackendSpec, Choice, backend_specs
from localradix.resolve import BackendError, Target, overlap_wanted, resolve


def _choice(name: str, device: str, default_dtype: str | None = None) -> Choice:
    spec = backend_specs()[name]
    return Choice(spec, Availability(True, "faked", device, default_dtype=default_dtype))


def test_nothing_resolved_is_auto() -> None:
    for name, device in (("cpu", "cpu"), ("cuda", "cuda"), ("llamacpp", "cpu"), ("mlx", "gpu")):
        resolved = resolve(_choice(name, device), ServerArgs())
        values = [getattr(resolved.args, f) for f in ("backend", "device", "dtype")]
        values += [resolved.args.overlap_schedule, resolved.args.mixed_prefill]
        assert "auto" not in values and None not in values, (name, values)
        assert resolved.args.backend == resolved.target.backend == name


def test_cuda_defaults() -> None:
    resolved = resolve(_choice("cuda", "cuda"), ServerArgs())
    assert resolved.target == Target("cuda", "cuda", "bfloat16", "flashinfer")
    assert resolved.overlap and not resolved.mixed_prefill
    assert resolved.args.overlap_schedule == "on" and resolved.args.dtype == "bfloat16"


def test_cpu_keeps_float32_weights_and_halves_the_cache() -> None:
    resolved = resolve(_choice("cpu", "cpu"), ServerArgs())
    assert resolved.target == Target("cpu", "cpu", "float32", "torch_native", "bfloat16")
    assert not resolved.overlap and resolved.args.overlap_schedule == "off"
    exact = resolve(_choice("cpu", "cpu"), ServerArgs(dtype="float32")).target
    assert exact.cache_dtype == "float32"  # an explicit float32 stays exact


def test_mixed_prefill_auto_follows_the_backend() -> None:
    assert resolve(_choice("llamacpp", "cpu"), ServerArgs()).mixed_prefill
    assert not resolve(_choice("llamacpp", "cpu"), ServerArgs(mixed_prefill="off")).mixed_prefill
    assert not resolve(_choice("cpu", "cpu"), ServerArgs()).mixed_prefill
    assert resolve(_choice("cpu", "cpu"), ServerArgs(mixed_prefill="on")).args.mixed_prefill == "on"


def test_explicit_settings_win() -> None:
    args = ServerArgs(device="cuda:1", dtype="float16", overlap_schedule="off")
    resolved = resolve(_choice("cuda", "cuda", "bfloat16"), args)
    assert resolved.target.device == "cuda:1" and resolved.target.dtype == "float16"
    assert not resolved.overlap


def test_unsupported_settings_raise() -> None:
    spec = BackendSpec("paged", 1, "", "m:p", "m:c", dtypes=("float16",), page_sizes=(16,))
    choice = Choice(spec, Availability(True, "faked", "x"))
    with pytest.raises(BackendError, match="does not support dtype 'float32'"):
        resolve(choice, ServerArgs(dtype="float32", page_size=16))
    with pytest.raises(BackendError, match="does not support --page-size 1"):
        resolve(choice, ServerArgs(dtype="float16"))


def test_overlap_auto_is_for_devices_apart_from_the_host() -> None:
    assert overlap_wanted("auto", "cuda:1") and overlap_wanted("auto", "npu:0")
    assert not overlap_wanted("auto", "cpu") and not overlap_wanted("auto", "gpu")
    assert overlap_wanted("on", "cpu") and not overlap_wanted("off", "cuda")


def test_parser_dialects() -> None:
    from localradix.resolve import reasoning_parser_for, tool_parser_for

    assert tool_parser_for("auto", None) == "hermes"
    assert tool_parser_for("auto", "{{ '[TOOL_CALLS]' }}") == "mistral"
    assert tool_parser_for("none", "<tool_call>") is None
    assert tool_parser_for("llama3", None) == "llama3"
    with pytest.raises(KeyError, match="unknown tool-call parser 'x'"):
        tool_parser_for("x", None)
    assert reasoning_parser_for(None, "</think>") is None
    assert reasoning_parser_for("auto", "</think>") == "qwen3"
    assert reasoning_parser_for("magistral", None) == "magistral"
    with pytest.raises(KeyError):
        reasoning_parser_for("x", None)
