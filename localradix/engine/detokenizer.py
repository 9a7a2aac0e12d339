"""Incremental detokenization: token ids in, text deltas out, never a broken character.

Each `add` decodes only a short window of ids (`prefix_offset:`) and emits what the newest ids
added to the text of that window minus its prefix (`prefix_offset:read_offset`), the scheme of
vLLM and SGLang: decoding the window with a little left context keeps tokenizers that strip a
leading space (SentencePiece) right, and a window that ends in U+FFFD is an incomplete UTF-8
character, held back until the next ids complete it.

Special tokens are skipped or kept as `skip_special_tokens` says, except `kept_special_ids`,
always kept: the markers the output parsers read (the window is decoded in runs between them).

Stop strings are the engine's decision (`sched/stop_check.py` finishes a request at the token
that completes one and names it in `matched_stop`); this side trusts it. While a request runs,
text that could still become a stop string is held back; when it ends with a stop string, its
last ids and the string come together (`finish(ids, matched_stop)`) and the text is cut where
that string starts, so a stream never shows (part of) a stop string.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from localradix.held_text import held_suffix_len

REPLACEMENT_CHAR = "\ufffd"
MAX_HELD_IDS = 4  # a UTF-8 character is at most 4 bytes, so at most 4 ids


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Decoder,
        skip_special_tokens: bool = True,
        stop: Iterable[str] = (),
        kept_special_ids: Iterable[int] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.kept = frozenset(kept_special_ids) if skip_special_tokens else frozenset()
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.text = ""  # all decoded text so far (may end in held-back stop-string prefixes)
        self.emitted = 0  # characters of `text` already returned
        self.stopped = False  # finished: nothing more is ever emitted
        self._prefix_offset = 0
        self._read_offset = 0

    @property
    def output_text(self) -> str:
        """The text returned so far (what a client has seen)."""
        return self.text[: self.emitted]

    def add(self, token_ids: Sequence[int]) -> str:
        """Append ids; return the new text that is safe to show (possibly "")."""
        if self.stopped:
            return ""
        self.ids.extend(token_ids)
        self._decode_window(final=False)
        return self._release(final=False)

    def finish(self, token_ids: Sequence[int] = (), matched_stop: str | None = None) -> str:
        """Append the request's last ids and flush everything held back, cut where the stop
        string the engine matched starts; call once, at the end."""
        if self.stopped:
            return ""
        self.ids.extend(token_ids)
        self._decode_window(final=True)
        pending = self.text[self.emitted :]
        cut = pending.find(matched_stop) if matched_stop else -1
        if cut >= 0:
            pending = pending[:cut]
        self.stopped = True
        self.emitted += len(pending)
        return pending

    # ---- internals -----------------------------------------------------------------------

    def _decode(self, ids: Sequence[int]) -> str:
        if not self.kept.intersection(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        parts: list[str] = []
        start = 0
        for i, token in enumerate(ids):
            if token in self.kept:
                parts.append(self.tokenizer.decode(ids[start:i], skip_special_tokens=True))
                parts.append(self.tokenizer.decode([token], skip_special_tokens=False))
                start = i + 1
        parts.append(self.tokenizer.decode(ids[start:], skip_special_tokens=True))
        return "".join(parts)

    def _decode_window(self, final: bool) -> None:
        if self._read_offset == len(self.ids):
            return
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        end = len(self.ids)
        window = self._decode(self.ids[self._prefix_offset : end])
        if not final and window.endswith(REPLACEMENT_CHAR):
            found = self._complete_part(prefix)
            if found is not None:
                end, window = found
            elif end - self._read_offset < MAX_HELD_IDS:
                return  # an incomplete character: wait for the ids that complete it
            # else: more ids than any character needs, so the model generated invalid bytes
        if not final and len(window) <= len(prefix):
            return  # nothing new yet (e.g. a skipped special token)
        self.text += window[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, end

    def _complete_part(self, prefix: str) -> tuple[int, str] | None:
        """The longest window, short of the last 1-3 ids, that ends in a whole character."""
        for k in range(1, min(MAX_HELD_IDS, len(self.ids) - self._read_offset)):
            window = self._decode(self.ids[self._prefix_offset : len(self.ids) - k])
            if len(window) > len(prefix) and not window.endswith(REPLACEMENT_CHAR):
                return len(self.ids) - k, window
        return None

    def _release(self, final: bool) -> str:
        pending = self.text[self.emitted :]
        if self.stop and not final:  # what may still grow into a stop string waits
            pending = pending[: len(pending) - held_suffix_len(pending, self.stop)]
        self.emitted += len(pending)
        return pending
