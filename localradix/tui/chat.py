"""The chat pane: try the model, watch each turn's prompt come back from the cache.

Every reply streams in and ends with a line of its usage: prompt tokens, how many of them the
radix cache served (`usage.prompt_tokens_details.cached_tokens`), tokens generated and speed.
The screen is installed once, so the conversation survives trips back to the dashboard.
"""

from __future__ import annotations

import time

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from localradix.tui import fmt
from localradix.tui.api import ApiError, ChatDelta, ChatUsage


class Turn(Static):
    """One message; assistant turns grow as deltas arrive."""

    def __init__(self, role: str, text: str = "") -> None:
        super().__init__(text, markup=False, classes=role)
        self.role, self.body = role, text
        self.border_title = "you" if role == "user" else "model"

    def append(self, delta: str) -> None:
        self.body += delta
        self.update(self.body)


class ChatScreen(Screen):
    BINDINGS = [
        Binding("escape", "back", "Dashboard", priority=True),
        Binding("ctrl+n", "new_chat", "New chat", priority=True),
    ]

    def __init__(self, max_tokens: int = 512) -> None:
        super().__init__(id="chat")
        self.max_tokens = max_tokens
        self.history: list[dict[str, str]] = []
        self.usages: list[ChatUsage] = []
        self.busy = False

    def compose(self) -> ComposeResult:
        yield Static(
            "[b]Chat[/] · Enter sends · Esc back to the dashboard · Ctrl+N new chat",
            id="chat-title",
        )
        yield Input(placeholder="System prompt (optional)", id="system")
        yield VerticalScroll(id="turns")
        yield Input(placeholder="Type a message; Enter sends", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#system", Input).border_title = "system prompt"
        self.query_one("#prompt", Input).border_title = "message"
        self.query_one("#prompt", Input).focus()

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_new_chat(self) -> None:
        if self.busy:
            self.notify("A reply is still streaming", severity="warning")
            return
        self.history.clear()
        self.query_one("#turns").remove_children()
        self.query_one("#prompt", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "system":
            self.query_one("#prompt", Input).focus()
            return
        text = event.value.strip()
        if not text or self.busy:
            return
        event.input.value = ""
        self.history.append({"role": "user", "content": text})
        turns = self.query_one("#turns")
        turns.mount(Turn("user", text))
        reply = Turn("assistant")
        meta = Static("[dim]waiting for the first token…[/]", classes="meta")
        turns.mount(reply, meta)
        turns.scroll_end(animate=False)
        self.send(reply, meta)

    def messages(self) -> list[dict[str, str]]:
        system = self.query_one("#system", Input).value.strip()
        return ([{"role": "system", "content": system}] if system else []) + self.history

    @work(group="chat", exclusive=True)
    async def send(self, reply: Turn, meta: Static) -> None:
        self.busy = True
        start, first_at, usage = time.monotonic(), None, None
        try:
            model = await self.app.model_name()  # type: ignore[attr-defined]
            async for event in self.app.api.chat(  # type: ignore[attr-defined]
                model, self.messages(), self.max_tokens
            ):
                if isinstance(event, ChatDelta):
                    if first_at is None:
                        first_at = time.monotonic()
                        meta.update(f"[dim]streaming… TTFT {fmt.seconds(first_at - start)}[/]")
                    reply.append(event.text)
                    self.query_one("#turns").scroll_end(animate=False)
                elif isinstance(event, ChatUsage):
                    usage = event
            self.history.append({"role": "assistant", "content": reply.body})
            meta.update(usage_line(usage, start, first_at, time.monotonic()))
            if usage is not None:
                self.usages.append(usage)
        except ApiError as e:
            self.history.pop()  # the user turn goes unanswered; let it be retried
            meta.update(f"[$text-error]error: {escape(fmt.text(str(e), 200))}[/]")
        finally:
            self.busy = False
            self.query_one("#turns").scroll_end(animate=False)


def usage_line(usage: ChatUsage | None, start: float, first_at: float | None, end: float) -> str:
    """`prompt 412 · cached 398 (97%) · 37 generated · TTFT 0.21s · 41 tok/s`."""
    ttft = (first_at - start) if first_at else None
    if usage is None:
        return f"[dim]no usage reported · TTFT {fmt.seconds(ttft)}[/]"
    p, c, g = usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens
    share = c / p if c is not None and p else None
    speed = g / (end - first_at) if g and first_at and end > first_at else None
    return (
        f"[dim]prompt {fmt.count(p)} · [/][b $text-success]cached {fmt.count(c)} "
        f"({fmt.pct(share)})[/][dim] · {fmt.count(g)} generated · TTFT {fmt.seconds(ttft)}"
        f" · {fmt.rate(speed)}[/]"
    )
