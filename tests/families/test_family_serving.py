"""localradix's llama.cpp backend serves every model family as llama.cpp itself would.

Per family, in-process (`localradix.Engine` with the llamacpp backend) on its tiny GGUF:
- greedy output equals llama-cpp-python's single-sequence greedy output (token-id prompts);
- a request sharing a long prefix with an earlier one finds >= 90% of it cached, and gives the
  tokens the same request gives on a fresh engine with the radix cache off;
- hybrid and recurrent families (whose state cannot simply be truncated to a prefix): a 6-turn
  conversation and 16 requests behind one system prompt are cached about as well as on the dense
  llama fixture; with the cache and without, each request gives llama.cpp's own single-sequence
  tokens (up to a float-noise tie of llama.cpp's own, where a batch may round the other way).
And once per family, `localradix serve --backend llamacpp` starts on the GGUF and answers a chat
completion and a token-id completion.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import THREADS, Greedy, Reference, family_params, requires_llama_cpp

pytestmark = [pytest.mark.slow, requires_llama_cpp]

NEW = 16
POOL = 8192  # KV cells: every workload below fits without eviction
STATEFUL = family_params(("hybrid", "recurrent"))
MIN_SHARED_HIT = 0.9  # of the shared prefix, on the second request
COMPARABLE = 0.9  # a stateful family's cached share, relative to the dense llama's


def _ids(seed: int, n: int) -> list[int]:
    """Token ids every fixture's vocabulary has (SentencePiece ones hold 1,024), past the
    special and byte tokens, so no tokenizer question arises."""
    rng = random.Random(seed)
    return [rng.randrange(300, 1000) for _ in range(n)]


def _greedy(n: int = NEW) -> Any:
    from localradix.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


@contextmanager
def _engine(path: Path, **kw: Any) -> Iterator[Any]:
    from localradix import Engine

    with Engine(str(path), backend="llamacpp", threads=THREADS, max_total_tokens=POOL, **kw) as e:
        yield e


@dataclass
class Answer:
    tokens: tuple[int, ...]
    prompt_tokens: int
    cached_tokens: int


def _run(engine: Any, prompts: Sequence[Sequence[int]], n: int = NEW) -> list[Answer]:
    """All prompts at once (one batch where they fit); fails with the engine's own error."""
    results = engine.generate([list(p) for p in prompts], _greedy(n))
    for r in results:
        assert r.error is None, f"{r.error_code}: {r.error}"
    return [Answer(tuple(r.token_ids), r.prompt_tokens, r.cached_tokens) for r in results]


# ---- every family --------------------------------------------------------------------------
@pytest.mark.parametrize("family", family_params())
def test_greedy_equals_llama_cpp(
    family: str, gguf_path: Callable[[str], Path], llama_cpp_greedy: Greedy
) -> None:
    prompt = _ids(1, 24)
    expected = llama_cpp_greedy(family, prompt, NEW)
    with _engine(gguf_path(family)) as engine:
        (got,) = _run(engine, [prompt])
    assert got.tokens == expected


@pytest.mark.parametrize("family", family_params())
def test_shared_prefix_is_cached_and_exact(family: str, gguf_path: Callable[[str], Path]) -> None:
    shared, first, second = _ids(2, 200), _ids(3, 20), _ids(4, 20)
    with _engine(gguf_path(family)) as engine:
        _run(engine, [shared + first])
        (hit,) = _run(engine, [shared + second])
    with _engine(gguf_path(family), disable_radix_cache=True) as engine:
        (cold,) = _run(engine, [shared + second])
    assert hit.cached_tokens >= MIN_SHARED_HIT * len(shared), (
        f"{hit.cached_tokens} of the {len(shared)} shared tokens cached"
    )
    assert hit.tokens == cold.tokens


# ---- hybrid and recurrent families against the dense llama -----------------------------------
@dataclass
class Workload:
    prompts: list[list[int]]
    answers: list[Answer]

    @property
    def cached_share(self) -> float:
        """Cached prompt tokens over prompt tokens, after the first request (nothing to hit)."""
        rest = self.answers[1:]
        return sum(a.cached_tokens for a in rest) / sum(a.prompt_tokens for a in rest)

    @property
    def outputs(self) -> list[tuple[int, ...]]:
        return [a.tokens for a in self.answers]


def _conversation(engine: Any, turns: int = 6) -> Workload:
    """Each turn's prompt = the previous prompt + its reply + a new 20-token user message."""
    prompt = _ids(10, 60) + _ids(11, 20)
    prompts, answers = [], []
    for turn in range(turns):
        (answer,) = _run(engine, [prompt])
        prompts.append(prompt)
        answers.append(answer)
        prompt = prompt + list(answer.tokens) + _ids(12 + turn, 20)
    return Workload(prompts, answers)


def _system_prompt(engine: Any, requests: int = 16) -> Workload:
    """One 120-token system prompt: the first request alone, then the other 15 at once."""
    system = _ids(30, 120)
    prompts = [system + _ids(31 + i, 20) for i in range(requests)]
    return Workload(prompts, _run(engine, prompts[:1]) + _run(engine, prompts[1:]))


WORKLOADS: dict[str, Callable[[Any], Workload]] = {
    "conversation": _conversation,
    "system_prompt": _system_prompt,
}


@pytest.fixture(scope="module")
def dense_shares(gguf_path: Callable[[str], Path]) -> dict[str, float]:
    """The dense llama fixture's cached share on each workload: the bar to compare with."""
    shares = {}
    for name, workload in WORKLOADS.items():
        with _engine(gguf_path("llama")) as engine:
            shares[name] = workload(engine).cached_share
    return shares


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("family", STATEFUL)
def test_stateful_family_caches_like_dense(
    family: str,
    workload: str,
    gguf_path: Callable[[str], Path],
    dense_shares: dict[str, float],
    llama_cpp_reference: Callable[..., Reference],
) -> None:
    run = WORKLOADS[workload]
    with _engine(gguf_path(family)) as engine:
        cached = run(engine)
    with _engine(gguf_path(family), disable_radix_cache=True) as engine:
        cold = run(engine)
    # References use the cached run's prompts (a conversation's hold its replies).
    refs = [llama_cpp_reference(family, p, NEW) for p in cached.prompts]
    assert all(r.agrees(a.tokens) for r, a in zip(refs, cached.answers)), "cached != llama.cpp"
    assert all(r.agrees(a.tokens) for r, a in zip(refs, cold.answers)), "cache-off != llama.cpp"
    # Ties excuse what follows them only: most tokens must still be checked one for one.
    checked = sum(r.same_for(a.tokens) for run in (cached, cold) for r, a in zip(refs, run.answers))
    assert checked >= 0.75 * 2 * NEW * len(refs), f"only {checked} tokens checked: a weak check"
    assert cached.cached_share >= COMPARABLE * dense_shares[workload], (
        f"cached share {cached.cached_share:.2f}, dense llama {dense_shares[workload]:.2f}"
    )


# ---- the real server, once per family -------------------------------------------------------
@pytest.mark.parametrize("family", family_params())
def test_serve_answers(family: str, gguf_path: Callable[[str], Path]) -> None:
    from server.server_harness import start_server

    args = [str(gguf_path(family)), "--backend", "llamacpp"]  # `serve MODEL`: positional
    args += ["--threads", str(THREADS), "--max-total-tokens", str(POOL)]
    server = start_server(args, fake=False)
    try:
        with httpx.Client(base_url=server.base, timeout=120) as client:
            model = client.get("/models").json()["data"][0]["id"]
            chat = client.post(
                "/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": "Say something."}],
                    "max_tokens": 8,
                    "temperature": 0,
                },
            )
            assert chat.status_code == 200, chat.text
            assert chat.json()["usage"]["completion_tokens"] >= 1
            prompt = _ids(50, 24)
            done = client.post(
                "/completions",
                json={"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0},
            )
            assert done.status_code == 200, done.text
            assert done.json()["usage"]["prompt_tokens"] == len(prompt)
    finally:
        code = server.stop()
    assert code == 0, server.log()[-3000:]
