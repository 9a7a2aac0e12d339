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
  [b]q[/] quit        [b]p[/] pause / resume     [b]c[/] chat      [b]?[/] this help
  [b]f[/] flush the radix cache (refused while requests run)   [b]t[/] light / dark

[b $text-primary]Panels[/]
  [b]KV memory[/]   [$text-warning]█ used[/] by running requests, [$text-success]▓ cached[/] (evictable), [$text-muted]░ free[/]
  [b]Hit rate[/]    prompt tokens served from the cache: last 5 s ("now") and
              since start ("total"); a column per second that admitted prompts
  [b]Throughput[/]  prefill and decode tokens/s, a column per second
  [b]Batch[/]       running and waiting requests: prompt / cached / generated
              tokens, time to first token, decode speed, retractions
  [b]Radix[/]       largest cached prefixes, their hits, ● = locked by a request
  [b]Misses[/]      recent prompts that missed, and where they left the cache
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
