"""Compile constraints into grammars (in worker threads, cached) and track each request's state.

The scheduler sees only `GrammarService.submit` (a future) and `GrammarState` (fill a bitmask
row, accept a token); xgrammar stays behind this module. Bitmasks are int32 numpy arrays in
xgrammar's layout: bit j of word w allows token 32 * w + j.

Compiles run in daemon threads, a few at once (xgrammar releases the GIL while it compiles), so
one slow grammar (a deeply nested schema) delays neither the engine loop nor other grammars. A
compile that runs past the time limit fails its future with InvalidGrammar (a 400) and that
failure is cached; the thread cannot be stopped and finishes in the background.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any

import numpy as np

from localradix.sampling_params import Constraint

logger = logging.getLogger("localradix.grammar")

# Compiled grammars (and compile errors) kept for reuse, keyed by (kind, spec).
CACHE_ENTRIES = 256
COMPILE_THREADS = 4  # compiles running at once; more wait for a free one
DEFAULT_COMPILE_TIMEOUT_S = 10.0


class InvalidGrammar(ValueError):
    """The constraint cannot be compiled; the message says why (shown to the user as a 400;
    the scheduler fails the request with ErrorCode.INVALID_CONSTRAINT)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class GrammarState:
    """One request's position in its grammar."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def fill_mask(self, mask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into `mask[row]` (int32 bitmask)."""
        self._matcher.fill_next_token_bitmask(mask, row)

    def accept(self, token: int) -> bool:
        return bool(self._matcher.accept_token(token))

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens (speculative drafts tried by `spec.draft_masks`)."""
        self._matcher.rollback(n)

    @property
    def terminated(self) -> bool:
        return bool(self._matcher.is_terminated())


class GrammarService:
    """Compiles constraints for one tokenizer; each distinct constraint compiles once."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        compile_timeout: float = DEFAULT_COMPILE_TIMEOUT_S,
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._timeout = compile_timeout
        self._compiler: Any = None
        self._compiler_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(COMPILE_THREADS)
        self._cache: dict[tuple[str, str], Future[Any]] = {}
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def submit(self, constraint: Constraint) -> Future[Any]:
        """A future of the compiled grammar; a cached one (also for invalid ones) at once."""
        key = (constraint.kind, constraint.spec)
        with self._lock:
            future = self._cache.get(key)
            if future is None:
                future = Future()
                self._cache[key] = future
                while len(self._cache) > CACHE_ENTRIES:
                    self._cache.pop(next(iter(self._cache)))
                thread = threading.Thread(
                    target=self._run, args=(constraint, future), name="grammar", daemon=True
                )
                thread.start()
            return future

    def new_state(self, compiled: Any) -> GrammarState:
        import xgrammar as xgr

        return GrammarState(xgr.GrammarMatcher(compiled))

    def _run(self, constraint: Constraint, future: Future[Any]) -> None:
        """Compile into `future`, failing it at the time limit. The limit starts once the
        compiler exists (building it is a one-time cost, not the grammar's)."""
        try:
            compiler = self._ensure_compiler()
        except Exception as exc:  # e.g. a tokenizer xgrammar cannot read
            logger.exception("building the grammar compiler failed")
            _settle(future, error=InvalidGrammar(f"the grammar compiler failed: {exc}"))
            return
        timer = threading.Timer(self._timeout, self._expire, (future, constraint))
        timer.daemon = True
        timer.start()
        try:
            with self._slots:
                _settle(future, result=self._compile(compiler, constraint))
        except InvalidGrammar as exc:
            _settle(future, error=exc)
        finally:
            timer.cancel()

    def _expire(self, future: Future[Any], constraint: Constraint) -> None:
        limit = f"{self._timeout:g}"
        logger.warning("a %s grammar took over %s s to compile: refused", constraint.kind, limit)
        why = (
            f"the {constraint.kind} took longer than {limit} s to compile (the server's "
            "--grammar-compile-timeout); simplify it, e.g. fewer nested or repeated parts"
        )
        _settle(future, error=InvalidGrammar(why))

    def _compile(self, compiler: Any, constraint: Constraint) -> Any:
        try:
            return _COMPILERS[constraint.kind](compiler, constraint.spec)
        except KeyError:
            raise InvalidGrammar(f"unsupported constraint kind {constraint.kind!r}") from None
        except InvalidGrammar:
            raise
        except Exception as exc:  # xgrammar reports bad schemas/grammars as various errors
            raise InvalidGrammar(f"invalid {constraint.kind}: {_first_line(exc)}") from exc

    def _ensure_compiler(self) -> Any:
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_vocab_and_metadata(
                    self._encoded_vocab(), json.dumps(self._metadata())
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def _encoded_vocab(self) -> list[bytes | str]:
        tokens = self._tokenizer.convert_ids_to_tokens(range(self._vocab_size))
        return [t if t is not None else "" for t in tokens]

    def _metadata(self) -> dict[str, Any]:
        import xgrammar as xgr

        backend = getattr(self._tokenizer, "backend", None)
        detected = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str()) if backend else {}
        vocab_type = detected.get("vocab_type", xgr.VocabType.RAW)
        return {
            "vocab_type": int(getattr(vocab_type, "value", vocab_type)),
            "vocab_size": self._vocab_size,
            "add_prefix_space": detected.get("add_prefix_space", False),
            "stop_token_ids": list(self._tokenizer.eos_token_ids),
        }


def _settle(future: Future[Any], result: Any = None, error: Exception | None = None) -> None:
    """Complete `future` unless the timer (or the compile) already did."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


def _json_schema(compiler: Any, spec: str) -> Any:
    try:
        schema = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise InvalidGrammar(f"the JSON schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise InvalidGrammar("the JSON schema must be a JSON object")
    return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)


_COMPILERS = {
    "json_object": lambda c, _: c.compile_json_schema('{"type": "object"}', any_whitespace=False),
    "json_schema": _json_schema,
    "regex": lambda c, spec: c.compile_regex(spec),
    "ebnf": lambda c, spec: c.compile_grammar(spec),
    "structural_tag": lambda c, spec: c.compile_structural_tag(spec),
}


# xgrammar's C++ errors start with "[13:49:23] /project/cpp/json_schema_converter.cc:5082: ".
_CPP_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return _CPP_LOCATION.sub("", text.splitlines()[0])[:300]
