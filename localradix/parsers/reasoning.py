"""Reasoning parsers: split `<think>…</think>`-style reasoning from the answer.

A dialect is a pair of tags. The reasoning block must open the output; when the chat template
already wrote the opening tag at the end of the prompt (DeepSeek-R1, Qwen3 thinking models),
the output *starts in reasoning*: there is no opening tag, only the closing one. Whether it
does is best read from the rendered prompt (`ReasoningDialect.prompt_opens_reasoning`); each
dialect has a default for when the caller cannot tell.

Output rules, the same streamed and not: whitespace around the reasoning and before the answer
is dropped; without a reasoning block the output is content verbatim; an output cut off inside
the reasoning is all reasoning. Tags may arrive split across deltas: text that may be the start
of a tag is held back until the next delta decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from localradix.held_text import held_suffix_len

WHITESPACE = " \t\n\r"


class ReasoningDelta(NamedTuple):
    """What one `feed` decided: text for `delta.reasoning_content` and for `delta.content`."""

    reasoning: str
    content: str


class ReasoningSplit(NamedTuple):
    """A whole output: `reasoning` is None when the output has no reasoning block."""

    reasoning: str | None
    content: str


@dataclass(frozen=True)
class ReasoningDialect:
    name: str
    start: str
    end: str
    starts_in_reasoning: bool = False  # the default when the prompt is not known
    # What follows the block before the answer, where it is not whitespace (harmony's next
    # message header): a forced tool call's grammar writes it after the reasoning.
    resume: str = ""

    def parser(self, starts_in_reasoning: bool | None = None) -> ReasoningStreamParser:
        """A stream parser for one response."""
        if starts_in_reasoning is None:
            starts_in_reasoning = self.starts_in_reasoning
        return ReasoningStreamParser(self.start, self.end, starts_in_reasoning)

    def split(self, text: str, starts_in_reasoning: bool | None = None) -> ReasoningSplit:
        parser = self.parser(starts_in_reasoning)
        reasoning, content = parser.feed(text)
        tail = parser.finish()
        if not parser.entered_reasoning:
            return ReasoningSplit(None, content + tail.content)
        return ReasoningSplit(reasoning + tail.reasoning, content + tail.content)

    def prompt_opens_reasoning(self, prompt: str) -> bool:
        """Whether a rendered prompt ends inside an opened reasoning block."""
        return prompt.rstrip(WHITESPACE).endswith(self.start)


class ReasoningStreamParser:
    """feed(delta) -> ReasoningDelta; finish() flushes what was held back."""

    def __init__(self, start: str, end: str, starts_in_reasoning: bool) -> None:
        self._start, self._end = start, end
        self._buf = ""
        self._held_ws = ""  # reasoning's trailing whitespace: kept only if more reasoning follows
        self._state = "open" if starts_in_reasoning else "detect"
        self._tag_allowed = starts_in_reasoning  # a template-opened block may repeat the tag
        self.entered_reasoning = starts_in_reasoning

    def feed(self, text: str) -> ReasoningDelta:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> ReasoningDelta:
        return self._run(final=True)

    def _run(self, final: bool) -> ReasoningDelta:
        reasoning: list[str] = []
        content: list[str] = []
        while self._step(final, reasoning, content):
            pass
        return ReasoningDelta("".join(reasoning), "".join(content))

    def _step(self, final: bool, reasoning: list[str], content: list[str]) -> bool:
        """One state transition; False when the buffer needs more text (or is empty)."""
        state, buf = self._state, self._buf
        if state == "content":
            if buf:
                content.append(buf)
            self._buf = ""
            return False
        if state == "reasoning":
            return self._reasoning_step(final, reasoning)
        stripped = buf.lstrip(WHITESPACE)
        if state == "after":  # drop the whitespace between the reasoning and the answer
            self._buf = stripped
            self._state = "content" if stripped else "after"
            return bool(stripped)
        if state == "detect" or self._tag_allowed:
            if stripped.startswith(self._start):
                self._buf = stripped[len(self._start) :]
                self._state, self._tag_allowed, self.entered_reasoning = "open", False, True
                return True
            if self._start.startswith(stripped) and not final:
                return False  # might still become the opening tag
        if state == "detect":
            self._state = "content"
            return True
        # "open": reasoning has begun; drop its leading whitespace
        self._buf = stripped
        self._tag_allowed = False
        self._state = "reasoning" if stripped else "open"
        return bool(stripped)

    def _reasoning_step(self, final: bool, reasoning: list[str]) -> bool:
        buf = self._buf
        index = buf.find(self._end)
        if index != -1:
            self._emit(buf[:index], reasoning)
            self._held_ws = ""
            self._buf = buf[index + len(self._end) :]
            self._state = "after"
            return True
        keep = 0 if final else held_suffix_len(buf, (self._end,))
        self._emit(buf[: len(buf) - keep], reasoning)
        self._buf = buf[len(buf) - keep :]
        return False

    def _emit(self, text: str, reasoning: list[str]) -> None:
        full = self._held_ws + text
        body = full.rstrip(WHITESPACE)
        if body:
            reasoning.append(body)
        self._held_ws = full[len(body) :]


REASONING_PARSERS: dict[str, ReasoningDialect] = {
    # DeepSeek-R1 (and its distills): the template ends the prompt with "<think>\n".
    "deepseek-r1": ReasoningDialect("deepseek-r1", "<think>", "</think>", starts_in_reasoning=True),
    # Qwen3 / QwQ / GLM-4.5 style: the model writes "<think>" itself (hybrid Qwen3 templates
    # write an empty block into the prompt when thinking is off).
    "qwen3": ReasoningDialect("qwen3", "<think>", "</think>"),
    # Magistral / Mistral reasoning models: control tokens, visible only with special tokens kept.
    "magistral": ReasoningDialect("magistral", "[THINK]", "[/THINK]"),
    # Gemma 4: a "thought" channel; with thinking off the template writes an empty one.
    "gemma4": ReasoningDialect("gemma4", "<|channel>thought", "<channel|>"),
    # gpt-oss: reasoning is harmony's analysis channel, read by the harmony parser with the
    # calls and the answer (see `parsers.harmony`); these tags serve the prompt check and
    # the optional analysis message before a forced call.
    "harmony": ReasoningDialect(
        "harmony", "<|channel|>analysis<|message|>", "<|end|>", resume="<|start|>assistant"
    ),
}

# Reasoning dialects whose markers are special tokens the detokenizer must keep.
SPECIAL_MARKERS: dict[str, tuple[str, ...]] = {
    # Special tokens in some models of these dialects (Kimi K2 Thinking, some DeepSeek and
    # GLM builds); where they are plain text in the vocabulary, keeping them changes nothing.
    "qwen3": ("<think>", "</think>"),
    "deepseek-r1": ("<think>", "</think>"),
    "magistral": ("[THINK]", "[/THINK]"),
    "gemma4": ("<|channel>", "<channel|>"),
}


def get_reasoning_parser(name: str) -> ReasoningDialect:
    if name not in REASONING_PARSERS:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise KeyError(f"unknown reasoning parser {name!r}; known: {known}")
    return REASONING_PARSERS[name]


def detect_reasoning_parser(chat_template: str | None) -> str | None:
    """harmony's `<|channel|>` messages -> harmony; Gemma 4's thought channel -> gemma4;
    `[THINK]` -> magistral; `</think>` -> deepseek-r1 when the template is DeepSeek's
    (its `<｜Assistant｜>` marker), else qwen3; otherwise None."""
    if not chat_template:
        return None
    if "<|channel|>" in chat_template and "<|message|>" in chat_template:
        return "harmony"
    if "<|channel>thought" in chat_template:
        return "gemma4"
    if "[THINK]" in chat_template:
        return "magistral"
    if "</think>" in chat_template:
        return "deepseek-r1" if "<｜Assistant｜>" in chat_template else "qwen3"
    return None
