"""MiniMax-M2 dialect: one block holds all of a turn's calls.

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="KEY">VALUE</parameter>
    </invoke>
    <invoke name="NAME">...</invoke>
    </minimax:tool_call>

Whitespace between the tags belongs to nothing; a VALUE is all the text between its tags: the
template writes strings raw and everything else with `tojson`, and `param_value` types it back
by the function's schema. A `</parameter>` not followed by the next parameter or `</invoke>`
is part of the value. A block that does not read as calls stays content.
"""

from __future__ import annotations

from localradix.parsers.block_calls import (
    BlockToolParser,
    Call,
    XmlCalls,
    read_sequence,
)
from localradix.parsers.structural_tag import (
    ArgsFormat,
    Format,
    Function,
    const,
    either,
    joined,
    optional,
    seq,
)

BLOCK = "<minimax:tool_call>"
INVOKE = "<invoke name="
PARAMETER = "<parameter name="
END_INVOKE = "</invoke>"
END_PARAMETER = "</parameter>"


class MiniMaxM2ToolParser(BlockToolParser):
    name = "minimax-m2"
    markers = (BLOCK,)
    end = "</minimax:tool_call>"
    # Single tokens of MiniMax's vocabulary, which may mark them special: the detokenizer
    # must keep them (listing a marker that decoding shows anyway costs nothing).
    special_markers = (BLOCK, "</minimax:tool_call>")

    def read_calls(self, body: str) -> list[Call] | None:
        return read_sequence(body, lambda text: CALLS.read(text, self._schema))

    @staticmethod
    def forced_format(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
        """The block as the template writes it: after a newline (optional here, as a reasoning
        block may end in one already), one `<invoke>` per line."""
        calls = [
            seq(
                const(f'{INVOKE}"{name}">\n'),
                args(schema, style="minimax_xml"),  # ends in optional whitespace
                const(f"{END_INVOKE}\n"),
            )
            for name, schema in functions
        ]
        return seq(
            optional(const("\n")),
            const(f"{BLOCK}\n"),
            joined(either(calls), "", many),
            const("</minimax:tool_call>"),
        )


def _named_tag(text: str, opening: str) -> tuple[str, str] | None:
    """`<opening>"NAME">` at the start of `text` (quotes optional): NAME and the rest."""
    close = text.find(">", len(opening))
    if not text.startswith(opening) or close == -1:
        return None
    name = text[len(opening) : close]
    if len(name) >= 2 and name[0] == name[-1] == '"':
        name = name[1:-1]
    if "<" in name or "\n" in name or '"' in name:  # the `>` of a later tag, or stray quotes
        return None
    return name, text[close + 1 :]


# How this dialect writes its calls (below the tag reader it uses).
CALLS = XmlCalls(INVOKE, END_INVOKE, PARAMETER, END_PARAMETER, _named_tag)
