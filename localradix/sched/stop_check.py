"""When a request stops: stop tokens, EOS, its grammar, its length, or a stop string.

Stop strings are matched on text, so the checker is handed the tokenizer's `decode` (ids ->
text). That is the one place the engine loop decodes text; it is kept behind this seam so a
later step can move it out to the request tracker.
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
        p = req.params
        if token in p.stop_token_ids:
            req.finish("stop", token)
        elif token in self.eos_token_ids and not p.ignore_eos:
            req.finish("stop", token)
        elif req.grammar is not None and not req.grammar.accept(token):
            req.fail(f"token {token} broke the request's grammar", ErrorCode.ENGINE_FAILURE)
        elif req.grammar is not None and req.grammar.terminated:
            req.finish("stop", token)
        elif len(req.output_ids) >= p.max_new_tokens or req.seq_len >= self.context_len:
            req.finish("length")
        elif p.stop:
            matched = self.stop_string(req)
            if matched is not None:
                req.finish("stop", matched)

    def stop_string(self, req: Req) -> str | None:
        """The first of the request's stop strings in the text of its newest tokens, if any.
        A stop string spans at most one token per character, hence the window."""
        stops = req.params.stop
        window = max(len(s) for s in stops) + 1
        tail = self.decode(req.output_ids[-window:])
        return next((s for s in stops if s in tail), None)
