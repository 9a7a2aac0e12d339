"""The n-gram drafter: longest recent match in the request's own context, built incrementally,
then the radix cache's sequences (a real RadixCache, read-only)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spec_toys import Cache

from localradix.mem import check_invariants
from localradix.spec import ContextIndex, NgramConfig, NgramDrafter, TreeContinuations

EXACT = NgramConfig(min_match=2, max_match=5, max_candidates=10_000)


def reference_match(tokens: list[int], cfg: NgramConfig) -> tuple[int, int] | None:
    """Longest n first (max_match down to min_match), then the latest earlier occurrence whose
    continuation exists: the brute-force definition of the drafter's match."""
    last = len(tokens)
    for n in range(cfg.max_match, cfg.min_match - 1, -1):
        if n > last - 1:
            continue
        suffix = tokens[last - n :]
        for end in range(last - 2, n - 2, -1):
            if tokens[end - n + 1 : end + 1] == suffix:
                return end, n
    return None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 2), max_size=60),
    st.lists(st.integers(1, 7), min_size=1, max_size=20),
    st.sampled_from([1, 5, 10_000]),
)
def test_match_is_the_longest_then_latest_and_incremental(
    tokens: list[int], chunks: list[int], bulk_min: int
):
    """Fed piece by piece (pieces of >= bulk_min tokens are indexed in bulk, with hashes)."""
    index = ContextIndex(replace(EXACT, bulk_min=bulk_min))
    fed = 0
    for size in chunks * 10:  # extend piece by piece, checking after every piece
        if fed >= len(tokens):
            break
        index.extend(tokens[fed : fed + size])
        fed = min(fed + size, len(tokens))
        assert index.match() == reference_match(tokens[:fed], EXACT)
    assert index.tokens.tolist() == tokens[:fed]


def test_each_token_indexes_at_most_one_gram():
    """O(1) per appended token: one more position in the index, never a rescan."""
    index = ContextIndex(NgramConfig())
    tokens = np.random.default_rng(0).integers(0, 4, 2000)
    index.extend(tokens[:1000])  # a prompt: indexed in bulk
    assert len(index._bulk_ends) == 1000 - NgramConfig().min_match
    for i, token in enumerate(tokens[1000:], 1):
        index.extend([token])
        assert sum(len(v) for v in index._ends.values()) == i
    assert index.match() == reference_match(tokens.tolist(), index.config)


def test_proposes_what_followed_the_longest_match():
    cfg = NgramConfig(min_match=2, max_match=4)
    # "7 8" occurs twice; "6 7 8" only at the start, so the longer match wins over the later one.
    ctx = [6, 7, 8, 1, 2, 3, 5, 7, 8, 9, 9, 0, 6, 7, 8]
    draft = NgramDrafter(cfg, ctx).propose(3)
    assert draft.tokens.tolist() == [1, 2, 3]
    assert (draft.match_len, draft.source) == (3, "context")


def test_ties_go_to_the_most_recent_occurrence():
    ctx = [1, 2, 3, 10, 1, 2, 3, 11, 0, 1, 2, 3]
    draft = NgramDrafter(NgramConfig(min_match=3), ctx).propose(1)
    assert draft.tokens.tolist() == [11]


def test_no_draft_below_min_match_and_draft_capped_at_k():
    drafter = NgramDrafter(NgramConfig(min_match=3), [1, 2, 9, 5, 1, 2])
    assert len(drafter.propose(4)) == 0  # only "1 2" recurs: shorter than min_match
    drafter.append([9])
    assert drafter.propose(2).tokens.tolist() == [5, 1]
    assert drafter.propose(0).tokens.size == 0


def test_a_repeating_pattern_drafts_into_its_own_suffix():
    drafter = NgramDrafter(NgramConfig(min_match=3), [4, 5] * 4)
    assert drafter.propose(6).tokens.tolist() == [4, 5]  # continuation stops at the context end


def test_config_is_validated():
    with pytest.raises(ValueError):
        NgramConfig(min_match=0)
    with pytest.raises(ValueError):
        NgramConfig(min_match=5, max_match=4)


# ---- the radix tree fallback ---------------------------------------------------------------

OTHER = [50, 51, 52, 53, 54, 55, 56, 57, 58, 59]


def tree_drafter(cache: Cache, prompt: list[int], extra_key: str | None = None) -> NgramDrafter:
    cfg = NgramConfig(min_match=3, max_match=6)
    source = TreeContinuations(cache.cache, cfg.min_match, cfg.max_match, min_interval_s=0.0)
    return NgramDrafter(cfg, prompt, source, extra_key)


def test_tree_fallback_proposes_what_followed_in_another_sequence():
    mem = Cache()
    mem.put([1, 2] + OTHER)
    draft = tree_drafter(mem, [9, 9, 52, 53, 54]).propose(3)
    assert draft.tokens.tolist() == [55, 56, 57]
    assert (draft.match_len, draft.source) == (3, "tree")


def test_own_context_wins_over_the_tree():
    mem = Cache()
    mem.put(OTHER)
    draft = tree_drafter(mem, [52, 53, 54, 7, 7, 52, 53, 54]).propose(2)
    assert (draft.tokens.tolist(), draft.source) == ([7, 7], "context")


def test_tree_continuation_crosses_splits_and_follows_the_latest_child():
    mem = Cache()
    mem.put(OTHER + [1, 1, 1])
    mem.put(OTHER + [2, 2, 2])  # splits OTHER off: two children, this one more recent
    drafter = tree_drafter(mem, [0, 56, 57])  # "56 57" is too short; wait for a 3rd token
    assert len(drafter.propose(4)) == 0
    drafter.append([58])
    assert drafter.propose(4).tokens.tolist() == [59, 2, 2, 2]
    mem.cache.match_prefix(OTHER + [1, 1, 1])  # touch the other branch: now it is the latest
    assert drafter.propose(4).tokens.tolist() == [59, 1, 1, 1]


def test_tree_match_spans_a_node_edge_and_prefers_longer_agreement():
    mem = Cache()
    mem.put([7, 8, 9, 30, 31])
    mem.put([7, 8, 9, 40, 41, 3, 4, 5, 60])  # split after [7 8 9]
    mem.put([3, 4, 5, 61])  # "3 4 5" again, but without the "41" before it
    draft = tree_drafter(mem, [0, 41, 3, 4, 5]).propose(2)
    assert draft.tokens.tolist() == [60]
    assert draft.match_len == 4
    draft = tree_drafter(mem, [0, 9, 40, 41]).propose(2)  # the anchor straddles the split
    assert draft.tokens.tolist() == [3, 4]


def test_tree_namespaces_are_never_mixed():
    mem = Cache()
    mem.put(OTHER, extra_key="tenant-a")
    assert len(tree_drafter(mem, [52, 53, 54]).propose(3)) == 0
    assert len(tree_drafter(mem, [52, 53, 54], "tenant-b").propose(3)) == 0
    assert tree_drafter(mem, [52, 53, 54], "tenant-a").propose(3).tokens.tolist() == [55, 56, 57]


def test_tree_walk_is_read_only_and_sees_new_inserts():
    mem = Cache()
    mem.put([1, 2] + OTHER)
    drafter = tree_drafter(mem, [0, 70, 71, 72])
    assert len(drafter.propose(3)) == 0
    stamps = {n.id: (n.last_access_time, n.hit_count, len(n.key)) for n in mem.cache.iter_nodes()}
    mem.put([70, 71, 72, 73, 74])  # the cache grew: the snapshot is rebuilt
    assert drafter.propose(3).tokens.tolist() == [73, 74]
    for node in mem.cache.iter_nodes():
        if node.id in stamps:
            assert stamps[node.id] == (node.last_access_time, node.hit_count, len(node.key))
    check_invariants(mem.pool, mem.cache, idle=True)


def test_a_stale_snapshot_is_harmless_and_refreshed():
    """Evicted and refilled to the same size: the snapshot still answers from its own copies
    of the evicted keys (a draft the verifier will judge), until the periodic refresh."""
    mem = Cache()
    mem.put([1, 2] + OTHER)
    source = TreeContinuations(mem.cache, refresh_every=3, min_interval_s=0.0)
    assert source.continuation(np.array([52, 53, 54]), 2) is not None
    mem.cache.evict(100)
    mem.put([5] * 12)  # the same total size: not noticed
    stale = source.continuation(np.array([52, 53, 54]), 2)
    assert stale is not None and stale.tokens.tolist() == [55, 56]
    for _ in range(3):
        got = source.continuation(np.array([52, 53, 54]), 2)
    assert got is None
    assert source.continuation(np.array([5, 5, 5]), 2) is not None


def test_snapshot_rebuilds_at_most_once_per_interval():
    mem = Cache()
    now = [0.0]
    source = TreeContinuations(mem.cache, min_interval_s=1.0, clock=lambda: now[0])
    mem.put(OTHER)
    assert source.continuation(np.array([52, 53, 54]), 1) is not None  # first build
    mem.put([70, 71, 72, 73])
    now[0] = 0.5
    assert source.continuation(np.array([70, 71, 72]), 1) is None  # too soon: stale
    now[0] = 1.0
    assert source.continuation(np.array([70, 71, 72]), 1).tokens.tolist() == [73]


def test_common_grams_hash_collisions_and_many_candidates():
    mem = Cache()
    mem.put([1, 2, 3, 9] * 50)  # one anchor, 50 occurrences in one node
    mem.put([8, 1, 2, 3, 4, 5])
    source = TreeContinuations(mem.cache, min_interval_s=0.0)
    got = source.continuation(np.array([8, 1, 2, 3]), 2)
    assert got is not None and (got.tokens.tolist(), got.match_len) == ([4, 5], 4)
    got = source.continuation(np.array([9, 1, 2, 3]), 2)
    assert got is not None and (got.tokens.tolist(), got.match_len) == ([9, 1], 4)


def test_tree_fallback_with_pages():
    mem = Cache(page_size=4)
    mem.put(OTHER + [60, 61])  # 12 tokens: three whole pages
    draft = tree_drafter(mem, [0, 53, 54, 55]).propose(8)
    assert draft.tokens.tolist() == [56, 57, 58, 59, 60, 61]
