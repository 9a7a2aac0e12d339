"""The `?` screen: what the keys do and how to read the panels."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
[b]localradix[/] — watch requests become batches and the radix cache pay rent

[b $text-primary]Keys[/]
  [b]q[/]  quit            [b]p[/]  pause / resume updates
  [b]c[/]  chat pane       [b]f[/]  flush the radix cache (refused while requests run)
  [b]t[/]  light / dark    [b]?[/]  this help (Esc closes)

[b $text-primary]Panels[/]
  [b]KV memory[/]   [$text-warning]█ used[/] by running requests · [$text-success]▓ cached[/] prefixes
                (evictable) · [$text-muted]░ free[/]
  [b]Hit rate[/]    share of prompt tokens served from the cache over the last
                5 s ("now"), since start ("total"); one column per second,
                blank = no prompts that second
  [b]Throughput[/]  prefill and decode tokens/s, one column per second
  [b]Batch[/]       running requests: prompt / cached / generated tokens, TTFT
  [b]Radix[/]       largest cached prefixes, their hits, ● = locked by a request
  [b]Misses[/]      recent prompts that missed: cached/prompt and where they diverged
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,question_mark,q", "close", "Close", priority=True),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(HELP)

    def action_close(self) -> None:
        self.dismiss(None)
