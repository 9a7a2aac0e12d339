"""A job's output as the parsers read it: each choice's text through its own stream parser, and
the parser's events switched, once, into reasoning, content and tool-call deltas. Every
dialect's stream frames these; none looks at a parser event itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from localradix.messages import TokenLogprob
from localradix.parsers.events import ContentDelta, ToolCallDelta
from localradix.parsers.output_parser import ChatDelta as ParserEvent
from localradix.parsers.output_parser import ChatOutputParser, ReasoningContentDelta
from localradix.server.core.gather import Timing, batches
from localradix.server.core.output import output_spec
from localradix.server.errors import APIError
from localradix.server.tokenizer_manager import Delta, Job

_RANK = {ReasoningContentDelta: 0, ContentDelta: 1, ToolCallDelta: 2}


@dataclass
class Split:
    """Parser events as reasoning text, content text and tool-call deltas (None: no event of
    that kind; "": events without text)."""

    reasoning: str | None = None
    content: str | None = None
    calls: list[ToolCallDelta] = field(default_factory=list)

    def add(self, event: ParserEvent) -> None:
        if isinstance(event, ReasoningContentDelta):
            self.reasoning = (self.reasoning or "") + event.text
        elif isinstance(event, ContentDelta):
            self.content = (self.content or "") + event.text
        elif isinstance(event, ToolCallDelta):
            self.calls.append(event)

    @property
    def last_rank(self) -> int:
        return 2 if self.calls else 1 if self.content is not None else 0


def split(events: Sequence[ParserEvent]) -> Split:
    """All of `events` in one Split (a dialect whose delta holds all three at once)."""
    out = Split()
    for event in events:
        out.add(event)
    return out


def runs(events: Sequence[ParserEvent]) -> list[Split]:
    """`events` in order, as Splits each read reasoning, then content, then calls: a new one
    starts where an event comes before what the current one already holds."""
    out: list[Split] = []
    for event in events:
        rank = _RANK.get(type(event))
        if rank is None:
            continue
        if not out or rank < out[-1].last_rank:
            out.append(Split())
        out[-1].add(event)
    return out


@dataclass(frozen=True)
class ParsedDelta:
    """One choice's delta (`text` as the engine gave it) with its text parsed."""

    index: int
    text: str
    events: list[ParserEvent]
    finish_reason: str | None
    logprobs: list[TokenLogprob]


class ParsedStream:
    """A job's batches of deltas, each choice's parsed by its own stream parser; `finish` is
    the first choice's finish reason once it ended (the one-choice dialects read it)."""

    def __init__(self, job: Job, timing: Timing | None = None) -> None:
        self.job = job
        self.timing = timing
        self.spec = output_spec(job)
        self.parsers: dict[int, ChatOutputParser] = {}  # one per choice, made at its first delta
        self.finish: str | None = None

    def parse(self, d: Delta) -> ParsedDelta:
        parser = self.parsers.get(d.index)
        if parser is None:
            parser = self.parsers[d.index] = self.spec.stream_parser()
        events = parser.feed(d.text) if d.text else []
        if d.finish_reason:
            events += parser.finish()
            if d.index == 0:
                self.finish = d.finish_reason
        return ParsedDelta(d.index, d.text, events, d.finish_reason, d.logprobs)

    async def deltas(self) -> AsyncIterator[list[ParsedDelta] | APIError]:
        """Each batch parsed; an error after the headers went out is yielded, then the end."""
        async for part in batches(self.job, self.timing):
            if isinstance(part, APIError):
                yield part
                return
            yield [self.parse(d) for d in part]

    async def events(self) -> AsyncIterator[list[ParserEvent] | APIError]:
        """The parser events of each delta, one list per delta."""
        async for part in self.deltas():
            if isinstance(part, APIError):
                yield part
                return
            for d in part:
                yield d.events
