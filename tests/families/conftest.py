"""Session fixtures: the tiny GGUF of each family (built once, cached across runs) and
llama.cpp's own greedy continuation of a token-id prompt on it (the reference)."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .gguf_families import FAMILIES, family_gguf

HAS_LLAMA_CPP: bool = importlib.util.find_spec("llama_cpp") is not None
THREADS = 2  # localradix's llamacpp runner and the reference use the same thread count
REFERENCE_CTX = 2048

requires_llama_cpp = pytest.mark.skipif(
    not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed (localradix[llamacpp])"
)

Greedy = Callable[[str, Sequence[int], int], tuple[int, ...]]


@pytest.fixture(scope="session")
def gguf_path() -> Callable[[str], Path]:
    """gguf_path(family) -> the family's cached GGUF (built on first use, under a file lock)."""
    return family_gguf


@pytest.fixture(scope="session")
def llama_cpp_greedy(gguf_path: Callable[[str], Path]) -> Iterator[Greedy]:
    """llama_cpp_greedy(family, prompt ids, n) -> llama-cpp-python's greedy tokens: one
    sequence, a fresh context state per prompt, flash attention on (as localradix runs it)."""
    models: dict[str, Any] = {}
    done: dict[tuple[str, tuple[int, ...], int], tuple[int, ...]] = {}

    def greedy(family: str, ids: Sequence[int], n: int) -> tuple[int, ...]:
        key = (family, tuple(ids), n)
        if key not in done:
            if family not in models:
                models[family] = open_llama(gguf_path(family))
            done[key] = generate(models[family], list(ids), n)
        return done[key]

    yield greedy
    for llm in models.values():
        llm.close()


def open_llama(path: Path, n_ctx: int = REFERENCE_CTX, logits_all: bool = False) -> Any:
    """A llama-cpp-python model as the references run it: flash attention, localradix's threads
    (`logits_all`: `scores` holds every row, else only what `generate` needs)."""
    from llama_cpp import Llama

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    return Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_threads=THREADS,
        flash_attn=True,
        logits_all=logits_all,
        verbose=False,
    )


def generate(llm: object, ids: list[int], n: int) -> tuple[int, ...]:
    """`n` greedy tokens after `ids`, from a fresh state."""
    tokens: list[int] = []
    for token in llm.generate(ids, temp=0.0, reset=True):  # type: ignore[attr-defined]
        tokens.append(int(token))
        if len(tokens) == n:
            break
    return tuple(tokens)


TIE = 0.01  # a top-2 logit gap under this is a float-noise tie: batch shape may decide it


@dataclass(frozen=True)
class Reference:
    """llama.cpp's greedy tokens for one prompt and, at each, the gap to the runner-up logit."""

    tokens: tuple[int, ...]
    gaps: tuple[float, ...]

    def agrees(self, tokens: Sequence[int]) -> bool:
        """Equal, or equal up to a token where llama.cpp's own choice was a tie (past which a
        batched run may legitimately continue otherwise: its matmuls round differently)."""
        k = self.same_for(tokens)
        return k == len(self.tokens) == len(tokens) or (k < len(tokens) and self.gaps[k] < TIE)

    def same_for(self, tokens: Sequence[int]) -> int:
        """How many leading tokens equal llama.cpp's."""
        pairs = list(zip(self.tokens, tokens))
        return next((k for k, (a, b) in enumerate(pairs) if a != b), len(pairs))


@pytest.fixture(scope="session")
def llama_cpp_reference(gguf_path: Callable[[str], Path]) -> Iterator[Callable[..., Reference]]:
    """llama_cpp_reference(family, prompt ids, n) -> `Reference`: one sequence, flash attention."""
    models: dict[str, Any] = {}

    def reference(family: str, ids: Sequence[int], n: int) -> Reference:
        if family not in models:
            models[family] = open_llama(gguf_path(family), logits_all=True)
        llm = models[family]
        llm.reset()
        llm.eval(list(ids))
        tokens, gaps = [], []
        for _ in range(n):
            top2 = np.sort(llm.scores[llm.n_tokens - 1])[-2:]
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            tokens.append(token)
            gaps.append(float(top2[1] - top2[0]))
            llm.eval([token])
        return Reference(tuple(tokens), tuple(gaps))

    yield reference
    for llm in models.values():
        llm.close()


def family_params(kinds: Sequence[str] | None = None) -> list[str]:
    """Family names for parametrize, optionally only those of some kinds."""
    return [name for name, f in FAMILIES.items() if kinds is None or f.kind in kinds]
