"""The numpy attention plan shared by the torch and MLX backends: every request's keys, once."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from localradix.runner.attention_plan import plan_attention
from localradix.step import ForwardBatch


@st.composite
def batches(draw: st.DrawFn) -> ForwardBatch:
    """Requests forked from a few roots (shared leading slots), some decoding, some extending."""
    next_slot = 1
    roots = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 12))
        roots.append(np.arange(next_slot, next_slot + n))
        next_slot += n
    inputs, tables, prefixes = [], [], []
    for _ in range(draw(st.integers(1, 8))):
        root = roots[draw(st.integers(0, len(roots) - 1))]
        keep = draw(st.integers(0, len(root)))
        new = draw(st.integers(1, 4)) if draw(st.booleans()) else 1
        own = np.arange(next_slot, next_slot + new)
        next_slot += new + draw(st.integers(0, 2))  # gaps: not every table is one run
        tables.append(np.concatenate([root[:keep], own]))
        inputs.append(np.zeros(new, dtype=np.int64))
        prefixes.append(keep)
    return ForwardBatch.build(inputs, tables, prefixes)


def _table(batch: ForwardBatch, req: int) -> list[int]:
    return batch.kv_indices[batch.kv_indptr[req] : batch.kv_indptr[req + 1]].tolist()


@settings(max_examples=200, deadline=None)
@given(batches(), st.sampled_from([None, 1, 7, 40]), st.sampled_from([1, 2, 3, 64]))
def test_each_request_sees_exactly_its_slots(batch, gather_tokens, minimum) -> None:
    plan = plan_attention(batch, gather_tokens, minimum)
    rows_of = {int(r): i for i, r in enumerate(batch.qo_indptr[:-1])}
    seen: list[int] = []
    for group in plan.decodes:
        assert group.all_rows == (len(group.token_rows) == batch.num_tokens)
        for b, row in enumerate(group.token_rows):
            req = rows_of[int(row)]
            seen.append(req)
            if group.run is not None:
                own = list(range(group.run.start, group.run.stop))
            else:
                real = group.slots[b] if group.valid is None else group.slots[b][group.valid[b]]
                own = real.tolist()
            prefix = [p.slots.tolist() for p in group.shared if b in p.rows.tolist()]
            assert len(prefix) <= 1
            assert (prefix[0] if prefix else []) + own == _table(batch, req)
            assert own, "each request keeps its newest slot for itself"
    for extend in plan.extends:
        req = rows_of[extend.start]
        seen.append(req)
        assert extend.end - extend.start == batch.extend_lens[req] > 1
        if extend.slots is None:
            assert batch.prefix_lens[req] == 0
        else:
            assert extend.slots.tolist() == _table(batch, req)
            assert extend.causal is not None and extend.causal.sum(axis=1)[-1] == len(extend.slots)
            if extend.run is not None:  # the view a verify step reads instead of gathering
                assert list(range(extend.run.start, extend.run.stop)) == _table(batch, req)
            else:
                assert np.any(np.diff(extend.slots) != 1)
    assert sorted(seen) == list(range(batch.num_reqs))


def test_big_decode_batches_split_by_gathered_tokens() -> None:
    tables = [np.arange(1 + 10 * i, 11 + 10 * i) for i in range(6)]
    batch = ForwardBatch.build([np.zeros(1, np.int64)] * 6, tables, [9] * 6)
    assert len(plan_attention(batch).decodes) == 1
    assert [len(g.token_rows) for g in plan_attention(batch, 20).decodes] == [2, 2, 2]
    assert len(plan_attention(batch, 1).decodes) == 6  # at least one request per call
