"""What chat and text completions render alike, streamed or whole: the envelope's usage, the
logprobs, the finish reason, SSE framing."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from localradix.messages import TokenLogprob
from localradix.server.core.http import sse
from localradix.server.errors import APIError
from localradix.server.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
    Usage,
)
from localradix.server.tokenizer_manager import Job, TokenizerManager

SSE_DONE = b"data: [DONE]\n\n"
# The engine's finish reason, as OpenAI words it when the choice made tool calls (else as is).
TOOL_CALL_FINISH = {"stop": "tool_calls"}


def finish_reason(finish: str | None, called: bool) -> str | None:
    """A choice that made tool calls ends with "tool_calls", unless it ran out of tokens."""
    return TOOL_CALL_FINISH.get(finish or "", finish) if called else finish


def sse_error(err: APIError) -> bytes:
    """An error after the headers went out: an error event, then the end of the stream."""
    return sse(err.body()) + SSE_DONE


def usage(job: Job) -> Usage:
    return msgspec.convert(job.usage(), Usage)


def chat_logprobs(manager: TokenizerManager, lps: Sequence[TokenLogprob]) -> ChatLogprobs:
    def top(token_id: int, logprob: float) -> TopLogprob:
        text = manager.token_text(token_id)
        return TopLogprob(text, finite(logprob), list(text.encode()))

    def entry(lp: TokenLogprob) -> ChatTokenLogprob:
        first = top(lp.token_id, lp.logprob)
        tops = [top(t, v) for t, v in lp.top]
        return ChatTokenLogprob(first.token, first.logprob, first.bytes, tops)

    return ChatLogprobs([entry(lp) for lp in lps])


def completion_logprobs(
    manager: TokenizerManager, lps: Sequence[TokenLogprob], offset: int
) -> CompletionLogprobs:
    tokens, offsets = [], []
    for lp in lps:
        tokens.append(manager.token_text(lp.token_id))
        offsets.append(offset)
        offset += len(tokens[-1])
    return CompletionLogprobs(
        tokens=tokens,
        token_logprobs=[finite(lp.logprob) for lp in lps],
        top_logprobs=[{manager.token_text(t): finite(v) for t, v in lp.top} for lp in lps],
        text_offset=offsets,
    )


def finite(x: float) -> float:
    return x if x > -1e30 else -9999.0  # JSON has no -inf
