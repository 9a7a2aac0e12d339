"""Request bodies: decoded once, strictly, into a dialect's msgspec Struct.

Unknown keys are ignored; a wrong type is a 400 naming the field. An integer written as 2.0 is
still an integer (JSON Schema and many clients say so). The completion paths of other dialects
(Ollama's raw generate, /infill) convert their fields to OpenAI's with `convert`, and `renamed`
rewords an error with the dialect's names; chat requests go through their adapters instead.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from localradix.server.errors import APIError, from_decode_error

T = TypeVar("T")


def decode(body: bytes, type_: type[T], renames: dict[str, str] | None = None) -> T:
    """The body as a `type_`, or a 400 naming the field (with the dialect's name for it)."""
    try:
        return msgspec.json.decode(body, type=type_, strict=True)
    except msgspec.ValidationError:
        pass  # maybe an integer written as 2.0: retry with those as ints
    except msgspec.MsgspecError as exc:
        raise renamed(from_decode_error(exc), renames or {}) from None
    try:
        return msgspec.convert(_integral_floats_as_ints(msgspec.json.decode(body)), type_)
    except msgspec.MsgspecError as exc:
        raise renamed(from_decode_error(exc), renames or {}) from None


def convert(fields: dict[str, Any], type_: type[T], renames: dict[str, str]) -> T:
    """A dialect's fields as an OpenAI request Struct (type-checked as if sent as JSON)."""
    try:
        return msgspec.convert(fields, type_, strict=True)
    except msgspec.MsgspecError as exc:
        raise renamed(from_decode_error(exc), renames) from None


def renamed(err: APIError, renames: dict[str, str]) -> APIError:
    """An error about an OpenAI field, reworded with the dialect's name for it."""
    for ours, theirs in renames.items():
        # 'stop', 'stop[0]', 'response_format.json_schema': the field, alone or as a prefix
        err.message = re.sub(rf"'{re.escape(ours)}(?=['\[.])", f"'{theirs}", err.message)
        if err.param is not None and re.match(rf"{re.escape(ours)}(?![\w])", err.param):
            err.param = theirs + err.param[len(ours) :]
    return err


def _integral_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(v) for v in value]
    return value
