"""The `{"name": ..., "arguments": ...}` object of the JSON dialects, read as it arrives."""

from __future__ import annotations

import json

from localradix.parsers.json_scan import JsonScanner, Member


class CallObject:
    """A `{"name": ..., "arguments"|"parameters": ...}` object arriving piece by piece.

    The header is ready once the name is known and the arguments have begun (or the object is
    complete); arguments that are an object (or array, number, ...) stream as raw JSON text,
    arguments given as a JSON string are sent decoded, in one piece, once complete.
    """

    FIRST_KEYS = frozenset({"name", "arguments", "parameters", "type"})
    ARG_KEYS = ("arguments", "parameters")

    def __init__(self) -> None:
        self.scanner = JsonScanner()
        self.text = ""
        self._sent = 0  # characters of the arguments value already sent
        self._args_done = False

    def feed(self, text: str) -> int:
        consumed = self.scanner.feed(text)
        self.text += text[:consumed]
        return consumed

    def header(self) -> str | None | bool:
        """The name once the call can be committed; None: not yet; False: not a call."""
        members = self.scanner.members
        if members and members[0].key not in self.FIRST_KEYS:
            return False
        name: str | None = None
        member = self._member("name")
        if member is not None and member.end is not None:
            value = json.loads(self.text[member.start : member.end])
            if not isinstance(value, str) or not value:
                return False
            name = value
        args = self._args_member()
        if args is not None and self._is_string(args) and args.end is not None:
            if self._string_args(args) is None:
                return False  # a string that does not hold JSON: clients could not parse it
        if self.scanner.done:
            return name if name is not None else False
        if name is None or args is None or (self._is_string(args) and args.end is None):
            return None
        return name

    def take_args(self) -> str:
        """The next arguments fragment (the rest of them once the object is complete)."""
        if self._args_done:
            return ""
        args = self._args_member()
        if args is None:
            if self.scanner.done:
                self._args_done = True
                return "{}"
            return ""
        if self._is_string(args):
            if args.end is None:
                return ""
            self._args_done = True
            return self._string_args(args) or "{}"
        end = args.end if args.end is not None else len(self.text)
        fragment = self.text[args.start + self._sent : end]
        self._sent = end - args.start
        self._args_done = args.end is not None
        return fragment

    def args_complete(self) -> bool:
        args = self._args_member()
        return args is not None and args.end is not None

    def _member(self, key: str) -> Member | None:
        return next((m for m in self.scanner.members if m.key == key), None)

    def _args_member(self) -> Member | None:
        return next((m for m in self.scanner.members if m.key in self.ARG_KEYS), None)

    def _string_args(self, args: Member) -> str | None:
        """Arguments sent as a JSON string, decoded: "{}" when empty, None when not JSON."""
        decoded = str(json.loads(self.text[args.start : args.end]))
        if not decoded.strip():
            return "{}"
        try:
            json.loads(decoded)
        except ValueError:
            return None
        return decoded

    def _is_string(self, member: Member) -> bool:
        return self.text[member.start] == '"'
