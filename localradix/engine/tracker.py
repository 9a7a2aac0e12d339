"""One request as its caller sees it: fanned out to the engine, its outputs folded into text.

A request of `len(prompts)` prompts and `n` choices each becomes `len(prompts) * n` engine
requests (choices), with rids `{rid}-{index}` and seeds `seed + i`; the radix cache shares their
common prompt. Each engine output is folded into its choice: the ids are detokenized
incrementally, a stop string cuts the text, a stop token is not text, and the finish reason is
translated for the API. Both front ends wrap this one tracker — the server's `Job` and the
in-process `Engine` — so the same request gives the same text on both paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localradix.engine.detokenizer import Decoder, IncrementalDetokenizer
from localradix.messages import (
    CachePin,
    Embed,
    ErrorCode,
    GenerateRequest,
    RequestOutput,
    TokenLogprob,
)
from localradix.sampling_params import SamplingParams


@dataclass
class Delta:
    """New output of one choice since the previous batch."""

    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(eq=False)
class Choice:
    index: int
    rid: str
    prompt_index: int
    detok: IncrementalDetokenizer
    finished: bool = False
    finish_reason: str | None = None  # the API's: "stop" | "length" | "abort"
    completion_tokens: int = 0
    cached_tokens: int = 0
    last_time: float | None = None  # when its last tokens arrived (the server's latency metrics)
    token_ids: list[int] = field(default_factory=list)  # every generated id, stop token too
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated id
    final: RequestOutput | None = None  # the engine's last output for it

    @property
    def text(self) -> str:
        """The text so far, as a client has seen it."""
        return self.detok.output_text


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def as_dict(self) -> dict[str, Any]:
        """OpenAI's `usage` object."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def api_finish_reason(engine_reason: str | None) -> str:
    """The engine's finish reason as the API reports it (an engine error is raised, not
    reported, so anything but stop and length reads as an abort)."""
    return engine_reason if engine_reason in ("stop", "length") else "abort"


# What an embedding request samples: nothing it keeps (it ends after its prefill).
EMBED_PARAMS = SamplingParams(max_new_tokens=1, temperature=0.0)


def error_output(rid: str, message: str, code: ErrorCode) -> RequestOutput:
    """A request that ends in an error before (or without) generating anything."""
    return RequestOutput(rid, (), True, "error", error=message, error_code=code)


class RequestTracker:
    def __init__(
        self,
        rid: str,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        tokenizer: Decoder,
        embed: Embed | None = None,  # embedding requests: each choice's answer is a vector
    ) -> None:
        self.rid = rid
        self.prompts = prompts
        self.params = params
        self.embed = embed
        self.choices = [
            Choice(
                p * params.n + i,
                f"{rid}-{p * params.n + i}",
                p,
                IncrementalDetokenizer(
                    tokenizer, params.skip_special_tokens, params.stop, params.kept_special_ids
                ),
            )
            for p in range(len(prompts))
            for i in range(params.n)
        ]

    def engine_requests(
        self, pins: tuple[CachePin, ...] = (), require_cached_tokens: int = 0
    ) -> list[GenerateRequest]:
        """One engine request per choice: the prompt's ids, n = 1 and the fork's own seed."""
        n, seed = self.params.n, self.params.seed
        return [
            GenerateRequest(
                c.rid,
                tuple(self.prompts[c.prompt_index]),
                self.params.replace(n=1, seed=None if seed is None else seed + c.index % n),
                pins=pins,
                require_cached_tokens=require_cached_tokens,
                embed=self.embed,
            )
            for c in self.choices
        ]

    def apply(self, choice: Choice, out: RequestOutput, delta: Delta) -> None:
        """Fold one engine output into its choice and into `delta` (the choice's new output)."""
        if choice.finished:
            return
        choice.token_ids.extend(out.new_token_ids)
        choice.logprobs.extend(out.logprobs)
        ids, lps = out.new_token_ids, out.logprobs
        if out.finish_reason == "stop" and isinstance(out.matched_stop, int) and ids:
            if ids[-1] == out.matched_stop:  # the EOS / stop token itself is not text
                ids, lps = ids[:-1], lps[: len(ids) - 1]
        delta.logprobs.extend(lps)
        if not out.finished:
            delta.text += choice.detok.add(ids)
        else:  # the engine decided any stop string: cut where it starts (never shown)
            stop = out.matched_stop if isinstance(out.matched_stop, str) else None
            delta.text += choice.detok.finish(ids, stop)
            choice.finished = True
            choice.finish_reason = delta.finish_reason = api_finish_reason(out.finish_reason)
            choice.completion_tokens = out.completion_tokens
            choice.cached_tokens = out.cached_tokens
            choice.final = out

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.choices)

    def usage(self) -> Usage:
        """Each prompt counted once, however many choices it has; its cached tokens are the
        fewest any of its choices found (the others were deferred onto the first one's KV)."""
        return Usage(
            prompt_tokens=sum(len(p) for p in self.prompts),
            completion_tokens=sum(c.completion_tokens for c in self.choices),
            cached_tokens=sum(
                min(c.cached_tokens for c in self.choices if c.prompt_index == i)
                for i in range(len(self.prompts))
            ),
        )
