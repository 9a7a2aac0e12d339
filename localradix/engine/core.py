"""EngineCore: model + runner + KV pool + radix cache + scheduler, built from ServerArgs.

The engine loop (engine/loop.py) drives it one step at a time, in the server's engine process
and under the in-process `Engine`; not thread-safe (one owner thread calls every method).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from localradix.config import ServerArgs
from localradix.engine.cache_tiers import open_tiers
from localradix.messages import ModelInfo
from localradix.sched.sched_config import SchedulerConfig
from localradix.sched.scheduler import Scheduler

logger = logging.getLogger("localradix.engine")


class EngineCore:
    def __init__(self, args: ServerArgs) -> None:
        from localradix.loader import load_tokenizer, resolve_model
        from localradix.loader.embedding import embedding_head
        from localradix.platform import build_runner

        started = time.monotonic()
        source = resolve_model(args.model)
        self.tokenizer = load_tokenizer(source)
        built = build_runner(args, source)  # every "auto" resolved once (localradix/resolve.py)
        config, target, args = built.config, built.target, built.resolved.args
        self.runner = _with_overlap(built.runner, built.resolved.overlap, args, target.backend)
        context_len = args.context_length or config.max_position_embeddings
        tiers = open_tiers(args, source, target, self.runner, config)
        eos = tuple(self.tokenizer.eos_token_ids) or tuple(config.eos_token_ids)
        self.scheduler = Scheduler(
            self.runner,
            SchedulerConfig.from_args(args),
            context_len=context_len,
            eos_token_ids=eos,
            decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            vocab_size=config.vocab_size,
            grammar=_grammar_service(self.tokenizer, config.vocab_size, args),
            tiers=tiers,
        )
        # The loop's request interface is the scheduler's own (engine/loop.py's Core).
        self.add_request = self.scheduler.add_request
        self.abort = self.scheduler.abort
        self.step = self.scheduler.step
        self.has_work = self.scheduler.has_work
        self.stats = self.scheduler.stats
        head = embedding_head(source) if self.runner.embeds else None
        self.info = ModelInfo(
            name=args.served_model_name or source.name,
            path=str(source.path),
            context_length=context_len,
            vocab_size=config.vocab_size,
            backend=target.backend,
            device=target.device,
            dtype=target.dtype,
            kv_total_tokens=self.runner.kv_capacity,
            architecture=config.architecture,
            weight_bytes=built.runner.weight_bytes,
            kv_bytes=built.runner.kv_bytes,
            pooling=head.pooling if head is not None else None,
            embed_normalize=head.normalize if head is not None else True,
        )
        logger.info("Engine ready in %.1f s: %s", time.monotonic() - started, self.info)

    def persist(self) -> None:
        """A graceful stop: the cached prefixes go to the disk tier (when there is one)."""
        self.scheduler.close()

    def close(self) -> None:
        """Stop what the runner started (tensor-parallel workers); the loop calls it last."""
        self.runner.close()

    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests run."""
        if not self.scheduler.idle:
            return False
        self.scheduler.cache.reset()
        self.scheduler.check_invariants(idle=True)
        return True


def _with_overlap(runner: Any, wanted: bool, args: ServerArgs, backend: str) -> Any:
    """The runner, wrapped for overlap scheduling when wanted and possible."""
    if not wanted:
        return runner
    if not hasattr(runner, "logits"):
        logger.warning("overlap scheduling needs a torch runner: %s runs without it", backend)
        return runner
    if getattr(runner, "snapshots", None) is not None:  # taken after each step, not ahead
        logger.info("Overlap scheduling off: the model's recurrent state is snapshotted per step")
        return runner
    from localradix.runner.overlap import OverlapRunner

    logger.info("Overlap scheduling on: batch N+1 is prepared while batch N runs")
    # A step samples one token per request, or k + 1 per verifying request (--speculative).
    rows_per_request = args.speculative_k + 1 if args.speculative else 1
    return OverlapRunner(runner, capacity=4 * (args.max_running_requests + 1) * rows_per_request)


def _grammar_service(tokenizer: Any, vocab_size: int, args: ServerArgs) -> Any:
    """xgrammar-backed constrained decoding, or None (requests with a constraint get an error)."""
    import importlib.util

    if importlib.util.find_spec("xgrammar") is None:
        logger.info("xgrammar is not installed: structured output is off")
        return None
    from localradix.constrained.grammar import GrammarService

    return GrammarService(tokenizer, vocab_size, args.grammar_compile_timeout)
