"""Cached prefixes of llama.cpp's sliding-window models stay exact after its cell pool wraps.

llama.cpp takes a cell for new KV when its one sequence has slid a window past it; the radix
tree may still hold that cell for a later request sharing a shorter prefix. Here a request
longer than the free cells makes llama.cpp wrap (chunked, so its ubatches are small), then
requests hit prefixes of the earlier and of the wrapping request: each gives llama.cpp's own
greedy tokens, reports its hit, and llama.cpp's cells agree with the map when idle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from localradix.config import ServerArgs
from localradix.messages import GenerateRequest
from localradix.sampling_params import SamplingParams

from .conftest import THREADS, Reference, requires_llama_cpp

pytestmark = requires_llama_cpp

NEW = 6
PARAMS = SamplingParams(temperature=0.0, max_new_tokens=NEW, ignore_eos=True)
FIRST = [3 + (i * 7) % 1000 for i in range(300)]
SHARED = list(range(300, 500))
WRAPS = [5 + (i * 13) % 1000 for i in range(360)]  # needs the freed cells and then some more


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_prefix_hits_stay_exact_after_the_cells_wrap(
    family: str,
    gguf_path: Callable[[str], Path],
    llama_cpp_reference: Callable[..., Reference],
) -> None:
    from localradix.engine.core import EngineCore

    args = ServerArgs(
        model=str(gguf_path(family)),
        backend="llamacpp",
        threads=THREADS,
        max_total_tokens=700,
        chunked_prefill_size=16,
        max_running_requests=8,
        max_cached_tokens=10_000,  # one-off prompts turn cold after seconds: keep them all
    )
    prompts = {
        "first": FIRST,
        "shared": SHARED,
        "wraps": WRAPS,  # evicts "first" and wraps around into "shared"'s old cells
        "hit shared": SHARED[:150] + list(range(700, 720)),
        "hit wraps": WRAPS[:200] + list(range(720, 730)),
    }
    core = EngineCore(args)
    try:
        got = {name: _run(core, name, ids) for name, ids in prompts.items()}
        core.scheduler.check_invariants(idle=True)
    finally:
        core.close()
    assert got["hit shared"][1] == 150 and got["hit wraps"][1] == 200
    for name, ids in prompts.items():
        reference = llama_cpp_reference(family, ids, NEW)
        assert reference.agrees(got[name][0]), f"{name}: {got[name][0]} vs {reference}"


def _run(core, rid: str, ids: list[int]) -> tuple[tuple[int, ...], int]:
    core.add_request(GenerateRequest(rid, tuple(ids), PARAMS))
    tokens: list[int] = []
    cached = -1
    while core.has_work():
        for out in core.step():
            assert out.error is None, out.error
            tokens.extend(out.new_token_ids)
            cached = max(cached, out.cached_tokens or 0)
    return tuple(tokens), cached


def test_twinned_sequences_lower_the_running_limit_to_what_fits(
    gguf_path: Callable[[str], Path],
) -> None:
    """Twins halve llama.cpp's sequence ids: the default limit becomes the most that fit."""
    from localradix.engine.core import EngineCore

    core = EngineCore(ServerArgs(model=str(gguf_path("gemma3_text")), backend="llamacpp"))
    try:
        runner = core.scheduler.runner
        assert runner.max_running_requests == runner.seqs.n_seq // 2 - 2 < 64
        assert core.scheduler.args.max_running_requests == runner.max_running_requests
    finally:
        core.close()
