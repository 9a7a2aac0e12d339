"""When a request stops: stop tokens, EOS, its grammar, its length, or a stop string.

Stop strings are matched on text, so the checker is handed the tokenizer's `decode` (ids ->
text), the one place the engine loop decodes text. This is the only place a stop string is
decided: the request tracker's detokenizer trusts `matched_stop` and cuts the text there. (The
other way round, the API deciding and aborting, would cost no decode here but generate tokens
past the stop; this costs about 5 us per request and step with the bundled tokenizer.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from localradix.messages import ErrorCode
from localradix.sched.request import Req

Decode = Callable[[list[int]], str]


class StopChecker:
    def __init__(self, eos_token_ids: Iterable[int], context_len: int, decode: Decode) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        self.context_len = context_len
        self.decode = decode

    def check(self, req: Req, token: int) -> None:
        """Finish (or fail) `req` if `token`, just appended to its output, ends it."""
        p = req.ask.params
        if token in p.stop_token_ids:
            req.finish("stop", token)
        elif token in self.eos_token_ids and not p.ignore_eos:
            req.finish("stop", token)
        elif req.constraint.grammar is not None and not req.constraint.grammar.accept(token):
            req.fail(f"token {token} broke the request's grammar", ErrorCode.ENGINE_FAILURE)
        elif req.constraint.grammar is not None and req.constraint.grammar.terminated:
            req.finish("stop", token)
        elif p.stop and (matched := self.stop_string(req)) is not None:
            req.finish("stop", matched)  # (before the length: the last token may complete one)
        elif len(req.progress.output_ids) >= p.max_new_tokens or req.seq_len >= self.context_len:
            req.finish("length")

    def stop_string(self, req: Req) -> str | None:
        """The first of the request's stop strings in the text of its newest tokens, if any.
        A stop string spans at most one token per character, hence the window."""
        stops = req.ask.params.stop
        window = max(len(s) for s in stops) + 1
        tail = self.decode(req.progress.output_ids[-window:])
        return next((s for s in stops if s in tail), None)
