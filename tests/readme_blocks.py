"""README.md's code, as the tests read it: fenced blocks, inline code, shell commands."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
_INLINE = re.compile(r"`([^`]+)`")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block, in order ("" when no language is given)."""
    return _FENCE.findall(text)


def inline_code(text: str) -> list[str]:
    """Every inline `code` span outside the fenced blocks (a span may wrap over lines)."""
    return [" ".join(s.split()) for s in _INLINE.findall(_FENCE.sub("", text))]


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a shell snippet, as argv lists: comments dropped, `\\` continuations
    and quotes spanning lines joined, `a && b` split."""
    commands: list[list[str]] = []
    pending = ""
    for line in code.splitlines():
        pending += line + "\n"
        if line.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1] + " "
            continue
        try:
            tokens = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        pending = ""
        current: list[str] = []
        for token in [*tokens, "&&"]:
            if token != "&&":
                current.append(token)
            elif current:
                commands.append(current)
                current = []
    assert not pending.strip(), f"unterminated shell snippet: {pending!r}"
    return commands
