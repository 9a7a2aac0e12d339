"""An incremental, validating JSON scanner: finds where one JSON value ends in a stream.

Fed text piece by piece, it stops at the first character that cannot continue valid JSON
(`error`) or right after the value is complete (`done`), so everything it consumed is a valid
JSON prefix. For a top-level object it also records its members: each key with the span of its
value in the consumed text, available while the value is still arriving.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

WHITESPACE = " \t\n\r"
_HEX = set("0123456789abcdefABCDEF")
_ESCAPES = set('"\\/bfnrt')
_LITERALS = {"t": "true", "f": "false", "n": "null"}
_VALUE_FIRST = set('{["-0123456789tfn')

# Number DFA: state -> [(allowed chars, next state)]; accepting states end a valid number.
_DIGITS = "0123456789"
_NUMBER_DFA: dict[int, list[tuple[str, int]]] = {
    0: [("-", 1), ("0", 2), ("123456789", 3)],
    1: [("0", 2), ("123456789", 3)],
    2: [(".", 4), ("eE", 6)],
    3: [(_DIGITS, 3), (".", 4), ("eE", 6)],
    4: [(_DIGITS, 5)],
    5: [(_DIGITS, 5), ("eE", 6)],
    6: [("+-", 7), (_DIGITS, 8)],
    7: [(_DIGITS, 8)],
    8: [(_DIGITS, 8)],
}
_NUMBER_ACCEPTING = {2, 3, 5, 8}

# Scanner states.
_VALUE, _VALUE_OR_CLOSE, _KEY, _KEY_OR_CLOSE, _COLON, _COMMA_OR_CLOSE = range(6)
_STRING, _ESCAPE, _UNICODE, _NUMBER, _LITERAL, _DONE, _ERROR = range(6, 13)


@dataclass
class Member:
    """A top-level object member: its key and the span of its value in the consumed text
    (`end` is None while the value is still open)."""

    key: str
    start: int
    end: int | None = None


class JsonScanner:
    """Consumes one JSON value; `feed` returns how many characters it took."""

    def __init__(self) -> None:
        self.pos = 0
        self.members: list[Member] = []
        self._state = _VALUE
        self._stack: list[str] = []
        self._is_key = False
        self._key_raw: list[str] = []
        self._pending_key = ""
        self._unicode_left = 0
        self._number_state = 0
        self._literal_left = ""

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def error(self) -> bool:
        return self._state == _ERROR

    def feed(self, text: str) -> int:
        """Consume from `text` until it ends, the value is complete, or a character is invalid."""
        for i, ch in enumerate(text):
            if self._state in (_DONE, _ERROR):
                return i
            if not self._char(ch):  # a number ended just before `ch`
                if self._state == _DONE:
                    return i  # a top-level number: `ch` belongs to what follows
                self._char(ch)
            if self._state == _ERROR:
                return i
            self.pos += 1
        return len(text)

    def end(self) -> bool:
        """At end of input: whether a top-level number is complete (its end needed lookahead)."""
        if self._state == _NUMBER and not self._stack and self._number_state in _NUMBER_ACCEPTING:
            self._state = _DONE
        return self.done

    # -- the automaton -------------------------------------------------------------------

    def _char(self, ch: str) -> bool:
        """Advance by one character; False when a number just ended without consuming it."""
        state = self._state
        if state == _STRING:
            self._string_char(ch)
        elif state == _ESCAPE:
            self._escape_char(ch)
        elif state == _UNICODE:
            self._unicode_char(ch)
        elif state == _NUMBER:
            return self._number_char(ch)
        elif state == _LITERAL:
            self._literal_char(ch)
        elif ch in WHITESPACE:
            pass
        elif state in (_VALUE, _VALUE_OR_CLOSE):
            if state == _VALUE_OR_CLOSE and ch == "]":
                self._close()
            else:
                self._value_start(ch)
        elif state in (_KEY, _KEY_OR_CLOSE):
            if ch == '"':
                self._state, self._is_key, self._key_raw = _STRING, True, ['"']
            elif state == _KEY_OR_CLOSE and ch == "}":
                self._close()
            else:
                self._state = _ERROR
        elif state == _COLON:
            self._state = _VALUE if ch == ":" else _ERROR
        elif state == _COMMA_OR_CLOSE:
            self._comma_or_close(ch)
        return True

    def _value_start(self, ch: str) -> None:
        if ch not in _VALUE_FIRST:
            self._state = _ERROR
            return
        if self._at_top_member():
            self.members.append(Member(self._pending_key, self.pos))
        if ch == "{":
            self._stack.append("{")
            self._state = _KEY_OR_CLOSE
        elif ch == "[":
            self._stack.append("[")
            self._state = _VALUE_OR_CLOSE
        elif ch == '"':
            self._state, self._is_key = _STRING, False
        elif ch in "-0123456789":
            self._state, self._number_state = _NUMBER, 0
            self._number_char(ch)
        else:
            self._state, self._literal_left = _LITERAL, _LITERALS[ch][1:]

    def _at_top_member(self) -> bool:
        return len(self._stack) == 1 and self._stack[0] == "{"

    def _value_end(self, end: int) -> None:
        if not self._stack:
            self._state = _DONE
            return
        if self._at_top_member() and self.members and self.members[-1].end is None:
            self.members[-1].end = end
        self._state = _COMMA_OR_CLOSE

    def _close(self) -> None:
        self._stack.pop()
        self._value_end(self.pos + 1)

    def _comma_or_close(self, ch: str) -> None:
        top = self._stack[-1]
        if ch == ",":
            self._state = _KEY if top == "{" else _VALUE
        elif ch == ("}" if top == "{" else "]"):
            self._close()
        else:
            self._state = _ERROR

    def _string_char(self, ch: str) -> None:
        if self._is_key:
            self._key_raw.append(ch)
        if ch == '"':
            if self._is_key:
                self._pending_key = json.loads("".join(self._key_raw))
                self._state = _COLON
            else:
                self._value_end(self.pos + 1)
        elif ch == "\\":
            self._state = _ESCAPE
        elif ch < " ":
            self._state = _ERROR

    def _escape_char(self, ch: str) -> None:
        if self._is_key:
            self._key_raw.append(ch)
        if ch == "u":
            self._state, self._unicode_left = _UNICODE, 4
        else:
            self._state = _STRING if ch in _ESCAPES else _ERROR

    def _unicode_char(self, ch: str) -> None:
        if self._is_key:
            self._key_raw.append(ch)
        if ch not in _HEX:
            self._state = _ERROR
            return
        self._unicode_left -= 1
        if self._unicode_left == 0:
            self._state = _STRING

    def _number_char(self, ch: str) -> bool:
        for chars, nxt in _NUMBER_DFA[self._number_state]:
            if ch in chars:
                self._number_state = nxt
                return True
        if self._number_state not in _NUMBER_ACCEPTING:
            self._state = _ERROR
            return True
        self._value_end(self.pos)
        return False

    def _literal_char(self, ch: str) -> None:
        if ch != self._literal_left[0]:
            self._state = _ERROR
            return
        self._literal_left = self._literal_left[1:]
        if not self._literal_left:
            self._value_end(self.pos + 1)
