"""GrammarService: compiles beside each other (one slow grammar delays no other), a compile past
the time limit fails as InvalidGrammar (cached), and concurrent compiles are all correct."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import wait
from typing import Any

import pytest

from localradix.constrained import grammar
from localradix.constrained.grammar import GrammarService, InvalidGrammar
from localradix.sampling_params import Constraint

pytest.importorskip("xgrammar")


class ByteTokenizer:
    """Printable ASCII tokens plus an end-of-sequence token: a vocabulary xgrammar compiles for
    in milliseconds."""

    eos_token_ids = (128,)

    def convert_ids_to_tokens(self, ids: Any) -> list[str]:
        return [chr(i) if 32 <= i < 127 else f"<0x{i:02X}>" for i in ids]


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A constraint kind "held" whose compile blocks until the test releases it."""
    release = threading.Event()
    started = threading.Event()

    def compile_held(compiler: Any, spec: str) -> Any:
        started.set()
        release.wait(30)
        return compiler.compile_regex(spec)

    monkeypatch.setitem(grammar._COMPILERS, "held", compile_held)
    yield started, release
    release.set()


def test_a_slow_compile_delays_no_other_grammar(held: Any) -> None:
    started, release = held
    service = GrammarService(ByteTokenizer(), 129, compile_timeout=30)
    slow = service.submit(Constraint("held", "a+"))
    assert started.wait(30)
    others = [service.submit(Constraint("regex", f"[a-c]{{{i}}}")) for i in range(1, 4)]
    others.append(service.submit(Constraint("json_object")))
    done, _ = wait(others, timeout=30)
    assert len(done) == len(others) and not slow.done()
    for future in others:
        assert future.result() is not None
    release.set()
    assert slow.result(timeout=30) is not None


def test_a_compile_past_the_limit_is_an_invalid_grammar_and_stays_refused(held: Any) -> None:
    started, _ = held
    service = GrammarService(ByteTokenizer(), 129, compile_timeout=0.3)
    service.submit(Constraint("json_object")).result(timeout=30)  # the compiler exists now
    t0 = time.monotonic()
    future = service.submit(Constraint("held", "b+"))
    with pytest.raises(InvalidGrammar) as info:
        future.result(timeout=10)
    assert 0.25 < time.monotonic() - t0 < 5
    assert "longer than 0.3 s" in info.value.reason and "--grammar-compile-timeout" in str(
        info.value
    )
    again = service.submit(Constraint("held", "b+"))  # cached: no second compile, no wait
    assert again.done() and isinstance(again.exception(), InvalidGrammar)


def test_concurrent_compiles_are_each_right() -> None:
    service = GrammarService(ByteTokenizer(), 129)
    schemas = [
        {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
        for i in range(8)
    ]
    futures = [service.submit(Constraint("json_schema", json.dumps(s))) for s in schemas]
    for i, future in enumerate(futures):
        state = service.new_state(future.result(timeout=60))
        text = json.dumps({f"k{i}": i})
        assert all(state.accept(ord(ch)) for ch in text), text
        assert state.accept(128) and state.terminated
