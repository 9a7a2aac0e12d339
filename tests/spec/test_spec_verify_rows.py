"""The rows of a verify step through the runner's real sampler: with penalties, top-k/p,
min-p, seeds and grammar masks applied per position, speculation emits exactly the tokens a
plain one-token-at-a-time loop emits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spec_toys import ToyModel

from localradix.sampling_params import SamplingParams
from localradix.spec import (
    NgramConfig,
    NgramDrafter,
    accept_batch,
    draft_masks,
    expand_sampling,
    position_uniforms,
    token_uniforms,
)
from localradix.step import SamplingBatch

V = 6
PROMPTS = [[0, 1, 2, 3, 0, 1], [5, 5, 4], [2, 3, 2, 3, 2]]
PARAMS = [
    SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.4),
    SamplingParams(temperature=0.9, top_k=4, top_p=0.9, min_p=0.05, presence_penalty=0.3, seed=7),
    SamplingParams(
        temperature=1.2, top_p=0.97, repetition_penalty=1.2, frequency_penalty=0.3, seed=1234
    ),
]
# The runner's sampler picks by inverse CDF in vocabulary order whether or not a row filters
# (top-k/p, min-p), so verify rows may share a batch with anything.


def history(params: SamplingParams, prompt: list[int], out: list[int]):
    penalized = (
        params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty
    )
    return (np.array(prompt + out, dtype=np.int64), len(prompt)) if penalized else None


def logits(probs: np.ndarray):
    torch = pytest.importorskip("torch")
    with np.errstate(divide="ignore"):
        return torch.from_numpy(np.log(probs).astype(np.float32))


def plain(model: ToyModel, params: SamplingParams, prompt: list[int], n: int) -> list[int]:
    from localradix.runner.sampler import sample

    out: list[int] = []
    for t in range(n):
        u = token_uniforms(params.seed or 0, t, 1)
        sb = SamplingBatch.build([params], u, [history(params, prompt, out)])
        out.append(int(sample(logits(model.probs(prompt + out)[None]), sb).token_ids[0]))
    return out


def speculative_batch(model: ToyModel, n: int, seed: int, use_ngram: bool) -> list[list[int]]:
    """All requests in one batch per step, each with its own drafts (some none)."""
    from localradix.runner.sampler import sample

    rng = np.random.default_rng(seed)
    outs: list[list[int]] = [[] for _ in PROMPTS]
    while min(map(len, outs)) < n:
        drafts = []
        for prompt, out in zip(PROMPTS, outs):
            if use_ngram:
                d = NgramDrafter(NgramConfig(min_match=2), prompt + out).propose(4).tokens
            else:
                d = rng.integers(0, V, size=rng.integers(0, 5))
            drafts.append(np.asarray(d, dtype=np.int64))
        base = SamplingBatch.build(
            PARAMS, np.zeros(len(PARAMS)), [history(*a) for a in zip(PARAMS, PROMPTS, outs)]
        )
        draws = [
            position_uniforms(p.replace(seed=p.seed or 0), len(out), len(d) + 1, rng)
            for p, out, d in zip(PARAMS, outs, drafts)
        ]
        rows = expand_sampling(base, drafts, np.concatenate(draws))
        probs = np.concatenate(
            [model.rows(p + o, d.tolist()) for p, o, d in zip(PROMPTS, outs, drafts)]
        )
        targets = sample(logits(probs), rows).token_ids
        for out, d, verdict in zip(outs, drafts, accept_batch(drafts, targets)):
            out += verdict.tokens(d).tolist()
    return [out[:n] for out in outs]


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 2**31), st.booleans())
def test_runner_sampler_over_verify_rows_equals_the_plain_loop(seed: int, use_ngram: bool):
    pytest.importorskip("torch")
    model = ToyModel(V, seed=seed % 31)
    got = speculative_batch(model, 16, seed, use_ngram)
    want = [plain(model, p, prompt, 16) for p, prompt in zip(PARAMS, PROMPTS)]
    assert got == want


def test_a_seeded_token_does_not_depend_on_batch_mates():
    """Found by this suite: the pick order was sorted when any batch mate filtered."""
    torch = pytest.importorskip("torch")
    from localradix.runner.sampler import sample

    row = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    plain = SamplingParams(temperature=1.0)
    alone = sample(row, SamplingBatch.build([plain], np.array([0.35]), [None])).token_ids
    mates = [plain, SamplingParams(temperature=1.0, top_k=3)]
    batched = sample(
        torch.cat([row, row]), SamplingBatch.build(mates, np.array([0.35, 0.5]), [None, None])
    ).token_ids
    assert alone[0] == batched[0]


def test_expanding_without_drafts_is_the_identity():
    hist = (np.array([1, 2, 3]), 2)
    base = SamplingBatch.build(PARAMS, np.array([0.1, 0.2, 0.3]), [hist, None, hist])
    empty = [np.zeros(0, np.int64)] * 3
    same = expand_sampling(base, empty, base.uniform)
    for name in ("temperature", "top_p", "top_k", "min_p", "uniform", "logprobs"):
        assert np.array_equal(getattr(same, name), getattr(base, name))
    assert same.history[1] is None and same.history[0][0].tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        expand_sampling(base, empty[:2], base.uniform)


def test_histories_grow_by_the_drafts_before_each_row():
    base = SamplingBatch.build(PARAMS[:2], np.zeros(2), [(np.array([9, 8]), 1), None])
    rows = expand_sampling(base, [np.array([4, 5]), np.array([7])], np.zeros(5))
    assert [h[0].tolist() for h in rows.history[:3]] == [[9, 8], [9, 8, 4], [9, 8, 4, 5]]
    assert rows.history[0][1] == 1 and rows.history[3:] == (None, None)
    assert rows.temperature.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.9, 0.9])


def test_position_uniforms():
    rng = np.random.default_rng(0)
    seeded = SamplingParams(seed=5)
    assert position_uniforms(seeded, 3, 2, rng).tolist() == token_uniforms(5, 3, 2).tolist()
    assert len(set(position_uniforms(SamplingParams(), 0, 4, rng).tolist())) == 4


class Matcher:
    """`RollbackGrammar` over a real xgrammar matcher."""

    def __init__(self, compiled) -> None:
        import xgrammar as xgr

        self.m = xgr.GrammarMatcher(compiled)

    def fill_mask(self, mask: np.ndarray, row: int) -> None:
        self.m.fill_next_token_bitmask(mask, row)

    def accept(self, token: int) -> bool:
        return bool(self.m.accept_token(token))

    def rollback(self, n: int) -> None:
        self.m.rollback(n)


def test_draft_masks_follow_the_drafts_and_restore_the_grammar():
    xgr = pytest.importorskip("xgrammar")
    vocab = ["a", "b", "c", "ab", "x", "</s>"]
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo(vocab, stop_token_ids=[5])).compile_regex(
        "(ab)+c"
    )
    grammar = Matcher(compiled)
    assert grammar.accept(0)  # "a": the state the drafts start from
    drafts = np.array([1, 3, 4, 2])  # "b", "ab", then "x" is refused
    mask = np.zeros((6, 1), dtype=np.int32)
    assert draft_masks(grammar, drafts, mask, 1) == 2
    for j in range(3):  # row 1 + j: a fresh matcher after "a" + drafts[:j]
        fresh, want = Matcher(compiled), np.zeros((1, 1), dtype=np.int32)
        for token in [0] + drafts[:j].tolist():
            assert fresh.accept(token)
        fresh.fill_mask(want, 0)
        assert mask[1 + j, 0] == want[0, 0]
    assert mask[0, 0] == 0 and mask[4, 0] == 0  # rows outside are untouched
    again = np.zeros((1, 1), dtype=np.int32)
    grammar.fill_mask(again, 0)
    assert again[0, 0] == mask[1, 0]  # rolled back to just after "a"
