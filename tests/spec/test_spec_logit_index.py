"""ForwardBatch.num_sampled: a verify step samples the last n_i positions of request i."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from localradix.step import ForwardBatch


@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 5), st.integers(1, 9)), min_size=1))
def test_logit_index_is_the_last_n_positions_of_each_request(reqs):
    ids, tables, prefixes, sampled = [], [], [], []
    for extend, prefix, n in reqs:
        ids.append(np.arange(extend, dtype=np.int64))
        tables.append(np.arange(1, prefix + extend + 1, dtype=np.int64))
        prefixes.append(prefix)
        sampled.append(min(n, extend))
    batch = ForwardBatch.build(ids, tables, prefixes, list(range(len(reqs))), sampled)
    want, end = [], 0
    for (extend, _, _), n in zip(reqs, sampled):
        end += extend
        want += list(range(end - n, end))
    assert batch.logit_index.tolist() == want
    assert batch.num_rows == sum(sampled)
    assert batch.last_row.tolist() == (np.cumsum(sampled) - 1).tolist()
    if all(n == 1 for n in sampled):  # the plain step: nothing new for runners to read
        assert batch.num_sampled is None
        assert batch.logit_index.tolist() == batch.last_token_index.tolist()
