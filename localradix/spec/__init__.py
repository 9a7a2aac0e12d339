"""Speculative decoding without a draft model: n-gram drafts from the request's own context
and the radix cache, per-request adaptive draft length, and lossless verification.

Numpy only (like `mem/`, `sched/`, `step/`): the scheduler drives it, every runner benefits.
"""

from localradix.spec.adaptive import AdaptiveConfig, AdaptiveK, SpecCounters
from localradix.spec.cost_model import (
    CostConfig,
    StepCostModel,
    best_draft_len,
    expected_tokens,
)
from localradix.spec.draft_kv import kept_kv_len, rejected_slots
from localradix.spec.ngram import ContextIndex, Draft, NgramConfig, NgramDrafter
from localradix.spec.tree_source import Continuation, ContinuationSource, TreeContinuations
from localradix.spec.verify import (
    Verdict,
    accept,
    accept_batch,
    sample_targets,
    token_uniforms,
    verify,
    verify_batch,
)
from localradix.spec.verify_rows import (
    RollbackGrammar,
    draft_masks,
    expand_sampling,
    position_uniforms,
)

__all__ = [
    "AdaptiveConfig",
    "AdaptiveK",
    "ContextIndex",
    "CostConfig",
    "Continuation",
    "ContinuationSource",
    "Draft",
    "NgramConfig",
    "NgramDrafter",
    "RollbackGrammar",
    "SpecCounters",
    "StepCostModel",
    "TreeContinuations",
    "Verdict",
    "accept",
    "accept_batch",
    "best_draft_len",
    "draft_masks",
    "expected_tokens",
    "expand_sampling",
    "kept_kv_len",
    "position_uniforms",
    "rejected_slots",
    "sample_targets",
    "token_uniforms",
    "verify",
    "verify_batch",
]
