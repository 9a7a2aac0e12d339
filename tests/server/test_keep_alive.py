"""The keep-alive duration shared by Ollama's `keep_alive` and `--keep-alive`."""

from __future__ import annotations

import pytest

from localradix.server.core.keep_alive import keep_alive_seconds
from localradix.server.errors import APIError


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, None), (300, 300), (-1, -1), ("0", 0.0), ("5m", 300.0), ("1h30m", 5400.0),
     ("250ms", 0.25), (" -1 ", -1.0), ("1.5h", 5400.0)],
)  # fmt: skip
def test_seconds_and_go_durations(value, seconds):
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["", "5 minutes", "5m junk", "m5", "1d"])
def test_anything_else_is_a_400_that_says_what_to_try(value):
    with pytest.raises(APIError) as err:
        keep_alive_seconds(value)
    assert err.value.status == 400 and "try 300, '5m' or -1" in str(err.value.body())
