"""Speculative decoding (--speculative ngram) on a tiny random model: the same greedy tokens as
transformers, with drafts actually accepted, alone, batched, cached, paged, and under KV
pressure (retraction); seeded sampling the same with speculation on and off."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from localradix import Engine, SamplingParams
from localradix.runner.overlap import OverlapRunner
from localradix.spec import CostConfig, StepCostModel

from .conftest import hf_greedy, random_prompts, token_lists

NEW = 40


def _repeating(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    """Prompts that say the same thing twice: a greedy model that copies gets free drafts,
    and a tiny random model falls into loops that n-grams catch anyway."""
    return [p + p for p in random_prompts(seed, lengths)]


def _greedy_case(tiny_model, seed: int, lengths: tuple[int, ...]):
    """(model folder, repeating prompts, transformers' greedy tokens, greedy params)."""
    folder, hf = tiny_model("llama")
    prompts = _repeating(seed, lengths)
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    return folder, prompts, refs, SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)


def _draft_snapshot_clock(engine: Engine) -> Callable[[], None]:
    """Hands the clock of the tree's snapshot for drafts to the test: it stands still until
    the returned `refresh` moves it on by the snapshot's `min_interval_s`, after which the next
    draft lookup rebuilds the snapshot from what the tree holds then (the outputs so far)."""
    tree = engine.core.scheduler.speculator._tree
    now = [tree.clock()]
    tree.clock = lambda: now[0]

    def refresh() -> None:
        now[0] += tree.min_interval_s

    return refresh


def _assert_drafts_were_verified(engine: Engine) -> None:
    stats = engine.stats()
    assert stats.spec_accepted_tokens >= NEW // 2, "the verify path was never exercised"
    assert stats.spec_draft_tokens >= stats.spec_accepted_tokens
    engine.check_invariants(idle=True)  # rejected drafts' slots all went back


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_matches_transformers_with_drafts_accepted(tiny_model, page_size):
    folder, prompts, refs, params = _greedy_case(tiny_model, 11, (12, 20, 7))
    with Engine(
        str(folder),
        dtype="float32",
        max_total_tokens=4096,
        page_size=page_size,
        speculative="ngram",
        speculative_k=6,
    ) as engine:
        refresh_drafts = _draft_snapshot_clock(engine)
        assert token_lists(engine.generate(prompts[:1], params)) == refs[:1]  # alone
        # A random model does not copy its prompt, but the tree now holds prompt 0's output:
        # asked again, it is drafted from the tree (once its snapshot refreshes) and accepted.
        refresh_drafts()
        assert token_lists(engine.generate(prompts, params)) == refs  # batched, one cached
        _assert_drafts_were_verified(engine)


def test_retraction_with_drafts_matches(tiny_model):
    folder, prompts, refs, params = _greedy_case(tiny_model, 4, (20, 21, 22, 23, 24, 25))
    with Engine(
        str(folder),
        dtype="float32",
        max_total_tokens=300,  # 6 x (44 + 40) tokens do not fit: decode must retract
        new_token_ratio=0.05,
        speculative="ngram",
    ) as engine:
        assert token_lists(engine.generate(prompts, params)) == refs
        stats = engine.stats()
        assert stats.retractions > 0 and stats.spec_verify_steps > 0
        engine.check_invariants(idle=True)


def test_seeded_sampling_and_opt_out_unchanged(tiny_model):
    folder, _ = tiny_model("qwen2")
    prompts = _repeating(5, (16, 9))
    seeded = SamplingParams(temperature=0.7, top_p=0.9, seed=123, max_new_tokens=NEW)
    greedy = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)
    with Engine(str(folder), dtype="float32", max_total_tokens=4096) as plain:
        want_seeded = token_lists(plain.generate(prompts, seeded))
        want_greedy = token_lists(plain.generate(prompts, greedy))
    with Engine(str(folder), dtype="float32", max_total_tokens=4096, speculative="ngram") as eng:
        refresh_drafts = _draft_snapshot_clock(eng)
        opted_out = seeded.replace(speculative=False)
        assert token_lists(eng.generate(prompts, opted_out)) == want_seeded
        assert eng.stats().spec_verify_steps == 0  # nobody drafted for them
        refresh_drafts()  # the tree's snapshot for drafts refreshes: the outputs are drafts now
        assert token_lists(eng.generate(prompts, seeded)) == want_seeded
        assert eng.stats().spec_accepted_tokens > 0
        assert token_lists(eng.generate(prompts, greedy)) == want_greedy
        eng.check_invariants(idle=True)


def test_overlap_schedule_verifies_with_the_same_tokens(tiny_model):
    """The overlap runner verifies too: a verify step's rows each take a ring entry, and the
    step is read before the next is scheduled (the next drafts follow the accepted tokens)."""
    folder, prompts, refs, params = _greedy_case(tiny_model, 11, (12, 20, 7))
    with Engine(
        str(folder),
        dtype="float32",
        max_total_tokens=4096,
        max_running_requests=2,  # a small ring: verify rows wrap around it
        overlap_schedule="on",
        speculative="ngram",
        speculative_k=6,
    ) as engine:
        assert isinstance(engine.core.runner, OverlapRunner) and engine.core.runner.verifies
        refresh_drafts = _draft_snapshot_clock(engine)
        assert token_lists(engine.generate(prompts, params.replace(speculative=False))) == refs
        refresh_drafts()  # the tree's snapshot for drafts refreshes: the outputs are drafts now
        assert token_lists(engine.generate(prompts, params)) == refs
        _assert_drafts_were_verified(engine)


class _DearDrafts(StepCostModel):
    """A runner where a draft row costs ten decode steps."""

    def beta(self, batch_rows: int, batch_attention: float, context: int) -> float:
        return 10.0


def test_the_cost_model_decides_and_tokens_stay_the_same(tiny_model):
    """Whatever k the cost model picks, greedy tokens are transformers': pinned dear (a draft
    row costs a whole step) nobody drafts; pinned free, every request drafts k_max."""
    folder, prompts, refs, params = _greedy_case(tiny_model, 11, (12, 20, 7))
    with Engine(str(folder), dtype="float32", max_total_tokens=4096, speculative="ngram") as eng:
        speculator = eng.core.scheduler.speculator
        refresh_drafts = _draft_snapshot_clock(eng)
        assert token_lists(eng.generate(prompts, params)) == refs  # the fitted model
        refresh_drafts()  # the tree's snapshot for drafts refreshes: the outputs are drafts now
        verified = eng.stats().spec_verify_steps
        speculator.costs = _DearDrafts()
        assert token_lists(eng.generate(prompts, params)) == refs
        assert eng.stats().spec_verify_steps == verified  # drafts would not pay: none ran
        speculator.costs = StepCostModel(CostConfig(beta_prior=0.0, ridge=1e12))
        assert token_lists(eng.generate(prompts, params)) == refs
        _assert_drafts_were_verified(eng)
