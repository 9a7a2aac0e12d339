"""The model pool's arithmetic and flags: sizes, the default budget, the memory plan of a real
model (the bundled GGUF) and the checks `serve` makes before starting."""

from __future__ import annotations

import pytest

from localradix.config import ServerArgs
from localradix.messages import ModelInfo
from localradix.server.model_memory import BudgetError, default_budget, parse_size, plan_memory
from localradix.server.model_pool import check_pool_args
from localradix.store.source import ModelSource

MiB = 1024**2


@pytest.mark.parametrize(
    "text, expected",
    [("12GiB", 12 * 1024**3), ("800MB", 800_000_000), ("8G", 8_000_000_000), ("1.5 gib", 3 << 29),
     ("1048576", MiB), ("512KiB", 512 * 1024)],
)  # fmt: skip
def test_sizes_parse_in_both_unit_systems(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "12 parsecs", "-1G"])
def test_a_size_that_is_none_says_what_to_write(text):
    with pytest.raises(BudgetError, match="try 12GiB"):
        parse_size(text)


def test_the_default_budget_is_a_share_of_the_machine():
    import os

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert default_budget("cpu") == int(ram * 0.75)


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"max_loaded_models": 0}, "--max-loaded-models must be at least 1"),
        ({"memory_budget": "a lot"}, "--memory-budget 'a lot' is not a size"),
        ({"keep_alive": "soon"}, "--keep-alive 'soon' is not a duration"),
    ],
)
def test_serve_refuses_unusable_pool_flags(changes, problem):
    assert problem in (check_pool_args(ServerArgs(**changes)) or "")
    assert check_pool_args(ServerArgs(memory_budget="12GiB", keep_alive="-1")) is None


def test_the_plan_holds_the_weights_and_a_kv_pool_sized_to_the_room():
    from localradix.store.bundled import ensure_bundled

    gguf = ensure_bundled()
    source = ModelSource(gguf, "gguf", "smol")
    like = ModelInfo("d", str(gguf), 8192, 49152, "llamacpp", "cpu", "float16", 1)
    roomy = plan_memory(source, ServerArgs(), like, 4096 * MiB)
    assert 0.9 < roomy.weights / gguf.stat().st_size <= 1.0  # llama.cpp keeps them as stored
    assert roomy.kv_tokens == 4 * 8192  # four contexts, as the engine's default pool
    assert roomy.kv_bytes == roomy.kv_tokens * 30 * 3 * 64 * 2 * 2  # layers x heads x dims x K,V
    tight = plan_memory(source, ServerArgs(), like, roomy.weights + 100 * MiB)
    assert tight.kv_tokens < roomy.kv_tokens and tight.total <= roomy.weights + 100 * MiB
    fixed = plan_memory(source, ServerArgs(max_total_tokens=2048), like, 4096 * MiB)
    assert fixed.kv_tokens == 2048
