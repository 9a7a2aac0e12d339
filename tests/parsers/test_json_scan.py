"""The incremental JSON scanner agrees with json.loads on where a value ends and whether it is valid."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localradix.parsers.json_scan import JsonScanner

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


def scan(text: str, chunk: int = 0) -> tuple[JsonScanner, int]:
    scanner = JsonScanner()
    consumed = 0
    pieces = [text] if chunk == 0 else [text[i : i + chunk] for i in range(0, len(text), chunk)]
    for piece in pieces:
        taken = scanner.feed(piece)
        consumed += taken
        if taken < len(piece):
            break
    if not scanner.done and not scanner.error:
        scanner.end()
    return scanner, consumed


@settings(max_examples=300, deadline=None)
@given(
    value=values,
    indent=st.sampled_from([None, 1]),
    tail=st.sampled_from(["", " x", "]"]),
    chunk=st.integers(0, 5),
)
def test_valid_json_ends_where_it_should(
    value: object, indent: int | None, tail: str, chunk: int
) -> None:
    text = json.dumps(value, indent=indent)
    scanner, consumed = scan(text + tail, chunk)
    assert scanner.done and not scanner.error
    assert consumed == len(text)
    if isinstance(value, dict):
        assert [m.key for m in scanner.members] == list(value)
        for member in scanner.members:
            assert member.end is not None
            assert json.loads(text[member.start : member.end]) == value[member.key]


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet='{}[]",:0123456789.eE+-truefalsn \\u', max_size=16))
def test_validity_matches_json_loads(text: str) -> None:
    scanner, consumed = scan(text)
    try:
        json.loads(text)
        valid = True
    except ValueError:
        valid = False
    if valid:
        assert scanner.done and consumed == len(text.rstrip())
    elif scanner.done:  # a valid value followed by something else
        with pytest.raises(ValueError):
            json.loads(text)
        json.loads(text[:consumed])
    else:  # everything consumed is a prefix of some valid JSON
        assert scanner.error or consumed == len(text)


@pytest.mark.parametrize(
    ("text", "consumed", "done"),
    [
        ('{"a": 1}', 8, True),
        ("12 ", 2, True),
        ('{"a":1,}', 7, False),
        ('{"a" 1}', 5, False),
        ("01", 1, True),
        ("[1 2]", 3, False),
        ('{"a": tru}', 9, False),
        ("1.", 2, False),
        ('"\x01"', 1, False),
        ('"\\x"', 2, False),
        ('"\\u12g"', 5, False),
    ],
)
def test_examples(text: str, consumed: int, done: bool) -> None:
    scanner, n = scan(text)
    assert (n, scanner.done) == (consumed, done)
