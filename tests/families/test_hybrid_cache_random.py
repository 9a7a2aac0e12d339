"""Random workloads on a tiny hybrid model (Qwen3.5's gated delta-net beside attention) under a
small KV pool and a small snapshot budget: shared prefixes, aborts, eviction, retraction.

Every request that runs to its end gives llama.cpp's own single-sequence greedy tokens (up to a
tie: where llama.cpp's top two logits are within `conftest.TIE`, a batched step's rounding may
choose the other, and the rest follows from it); when the
engine is idle, the scheduler's checks hold (pool + tree + llama.cpp's cells agree, the runner
holds exactly the tree's snapshots), and after a flush no cell, snapshot or spare sequence id
is left behind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localradix.config import ServerArgs
from localradix.messages import GenerateRequest
from localradix.sampling_params import SamplingParams

from .conftest import THREADS, Reference, requires_llama_cpp

pytestmark = [pytest.mark.slow, requires_llama_cpp]

FAMILY = "qwen3_5"
NEW = 6
PARAMS = SamplingParams(temperature=0.0, max_new_tokens=NEW, ignore_eos=True)
STEMS = (tuple(range(300, 360)), tuple(range(900, 840, -1)))


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[int, tuple[int, ...], int | None]]:
    jobs = []
    for _ in range(draw(st.integers(1, 6))):
        stem = STEMS[draw(st.integers(0, 1))][: draw(st.integers(0, 60))]
        tail = tuple(draw(st.lists(st.integers(1000, 1400), min_size=1, max_size=12)))
        arrive = draw(st.integers(0, 6))
        abort = draw(st.none() | st.integers(arrive, arrive + 8))
        jobs.append((arrive, stem + tail, abort))
    return jobs


@pytest.fixture(scope="module")
def model(gguf_path: Callable[[str], Path]) -> str:
    return str(gguf_path(FAMILY))


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(work=workloads(), pool=st.sampled_from([160, 600]), chunk=st.sampled_from([0, 16]))
def test_random_workloads_give_llama_cpp_tokens_and_leak_nothing(
    model: str, llama_cpp_reference: Callable[..., Reference], work, pool: int, chunk: int
) -> None:
    from localradix.engine.core import EngineCore

    args = ServerArgs(
        model=model,
        backend="llamacpp",
        threads=THREADS,
        max_total_tokens=pool,
        chunked_prefill_size=chunk,
        max_running_requests=4,
        new_token_ratio=0.05,  # admit eagerly so the small pool has to retract
        snapshot_mib=0.04,  # about three snapshots of this model: most get dropped
    )
    core = EngineCore(args)
    try:
        got = _serve(core, work)
        sched = core.scheduler
        assert sched.runner.snapshots is not None
        assert sched.runner.snapshots.live == sched.cache.snapshots.count
        assert core.flush_cache()
        assert sched.runner.snapshots.live == 0 and sched.runner.seqs.live_cells == 0
    finally:
        core.close()
    for i, (_, prompt, abort) in enumerate(work):
        if abort is None:
            reference = llama_cpp_reference(FAMILY, prompt, NEW)
            assert reference.agrees(got[str(i)]), f"request {i}: {got[str(i)]} vs {reference}"


def _serve(core, work) -> dict[str, tuple[int, ...]]:
    got: dict[str, list[int]] = {}
    step = 0
    while step <= 14 or core.has_work():
        for i, (arrive, prompt, abort) in enumerate(work):
            if arrive == step:
                core.add_request(GenerateRequest(str(i), prompt, PARAMS))
            if abort == step:
                core.abort(str(i))
        for out in core.step():
            assert out.error is None, out.error
            got.setdefault(out.rid, []).extend(out.new_token_ids)
        if core.scheduler.idle:
            core.scheduler.check_invariants(idle=True)
        step += 1
        assert step < 2000, "the scheduler stopped making progress"
    return {rid: tuple(t) for rid, t in got.items()}
