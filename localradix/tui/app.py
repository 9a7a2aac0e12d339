"""The localradix dashboard: an htop for the model server, fed by its stats stream.

The app never talks to the engine directly: a `Feed` yields snapshots and connection changes,
an `ApiClient` flushes the cache and chats. Both are injected, so tests drive the app with a
scripted feed or a fake HTTP server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer

from localradix.tui.api import ApiClient, ApiError
from localradix.tui.chat import ChatScreen
from localradix.tui.feed import Connected, Disconnected, Feed, FeedEvent, Snapshot
from localradix.tui.help import HelpScreen
from localradix.tui.panels import (
    Banner,
    HeaderBar,
    HitRatePanel,
    KvPanel,
    Panel,
    StatusLine,
    ThroughputPanel,
    View,
)
from localradix.tui.stats import Stats
from localradix.tui.system import SystemProbe, SystemSample, merge
from localradix.tui.tables import BatchTable, MissTable, PrefixTable, ReplicaTable, RowsTable
from localradix.tui.trends import Trends

THEMES = ("textual-dark", "textual-light")


class ServerHandle(Protocol):
    """A server this app started (default mode): shown in the banner while it is not up."""

    pid: int
    log_path: Path | None

    def poll(self) -> int | None: ...


class LocalRadixApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "localradix"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("p", "pause", "Pause"),
        Binding("c", "chat", "Chat"),
        Binding("f", "flush", "Flush cache"),
        Binding("t", "toggle_theme", "Light/dark"),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    def __init__(
        self,
        feed: Feed,
        api: ApiClient,
        *,
        probe: SystemProbe | None = None,
        server: ServerHandle | None = None,
        clock: Callable[[], float] = time.time,
        system_interval: float = 1.0,
        theme: str | None = None,
        chat_max_tokens: int = 512,
        render_interval: float = 0.25,
    ) -> None:
        super().__init__()
        self.chat_max_tokens = chat_max_tokens
        self.render_interval = render_interval  # snapshots arriving faster are coalesced
        self._rendered_at = -1e9
        self._render_pending = False
        self.feed, self.api, self.server, self.clock = feed, api, server, clock
        self.probe = probe or SystemProbe(local=False)
        self.system_interval = system_interval
        self.stats, self.trends = Stats(), Trends()
        self.local_system = SystemSample(source="none")
        self.connected = self.ever_connected = self.paused = False
        self.auth_failed = False  # the last answer was 401/403: the banner says so, and stays
        self.last_data_at: float | None = None
        self.snapshots = 0
        self._model: str | None = None
        if theme:
            self.theme = theme

    def compose(self) -> ComposeResult:
        # Kept as attributes: the feed updates them while the chat or help screen is on top.
        self.header = HeaderBar(id="header")
        self.banner = Banner(id="banner")
        self.status = StatusLine(id="status")
        top = [KvPanel(id="kv"), HitRatePanel("Cache hit rate", id="hits")]
        top.append(ThroughputPanel("Throughput", id="throughput"))
        self.panels: list[Panel] = [self.header, *top, self.status]
        self.tables: list[RowsTable] = [
            BatchTable(id="batch"),
            PrefixTable(id="prefixes"),
            MissTable(id="misses"),
        ]
        yield self.header
        yield self.banner
        with Horizontal(id="top"):
            yield from top
        yield self.status
        yield self.tables[0]
        with Horizontal(id="bottom"):
            yield from self.tables[1:]
        yield Footer()

    def on_mount(self) -> None:
        self.install_screen(ChatScreen(self.chat_max_tokens), "chat")
        self.set_banner(self.waiting_message("connecting"))
        self.sample_system()
        self.set_interval(self.system_interval, self.sample_system)
        self.run_worker(self.consume_feed(), group="feed", exit_on_error=False)
        self.theme_changed_signal.subscribe(self, lambda _theme: self.render_view(force=True))
        self.render_view()

    # -- the feed -------------------------------------------------------------------------

    async def consume_feed(self) -> None:
        """Apply feed events forever; a broken feed shows in the banner, never as a traceback."""
        while True:
            try:
                async for event in self.feed.events():
                    self.apply(event)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the TUI must survive any feed failure
                self.connected = False
                self.set_banner(f"⚠ stats feed failed: {e} — retrying")
                self.render_view()
            await asyncio.sleep(1.0)

    def apply(self, event: FeedEvent) -> None:
        if isinstance(event, Snapshot):
            self.stats = Stats.parse(event.data)
            self.trends.add(self.stats, self.clock())
            self.snapshots += 1
            self.last_data_at = time.monotonic()
            self.on_connected()
            if self._model is None and self.stats.model.get("name"):
                self._model = str(self.stats.model["name"])
            if self.stats.replicas and not any(isinstance(t, ReplicaTable) for t in self.tables):
                self.add_replica_table()
        elif isinstance(event, Connected):
            self.on_connected()
        elif isinstance(event, Disconnected):
            self.connected, self.auth_failed = False, event.auth
            self.set_banner(self.disconnected_message(event))
        if isinstance(event, Snapshot):
            self.request_render()
        else:
            self.render_view()

    def add_replica_table(self) -> None:
        """Attached to an smg gateway: show each replica above the running batch."""
        table = ReplicaTable(id="replicas")
        self.mount(table, before=self.tables[0])
        self.tables.insert(0, table)

    def request_render(self) -> None:
        """Render now, or once at the end of the current interval if one just happened."""
        if self.paused:
            return
        wait = self._rendered_at + self.render_interval - time.monotonic()
        if wait <= 0:
            self.render_view()
        elif not self._render_pending:
            self._render_pending = True
            self.set_timer(wait, self._deferred_render)

    def _deferred_render(self) -> None:
        self._render_pending = False
        self.render_view()

    def on_connected(self) -> None:
        self.connected = self.ever_connected = True
        self.auth_failed = False
        dead = self.stats.engine_alive is False
        self.set_banner("⚠ the server answers but its engine is not running" if dead else "")

    def disconnected_message(self, event: Disconnected) -> str:
        if event.auth:  # the server is there: "cannot reach" would send the user astray
            return f"⚠ {self.feed.url} answered: {event.reason}"
        retry = f"retrying in {event.retry_in:.0f}s" if event.retry_in >= 1 else "retrying"
        if not self.ever_connected or self.server_exited():
            return self.waiting_message(f"{event.reason} — {retry}")
        ago = time.monotonic() - self.last_data_at if self.last_data_at else None
        since = f" · last data {ago:.0f}s ago" if ago is not None else ""
        return f"⚠ lost the server at {self.feed.url}: {event.reason} — {retry}{since}"

    def waiting_message(self, detail: str) -> str:
        url = self.feed.url
        if self.server is None:
            return f"⚠ cannot reach {url} ({detail}) — is `localradix serve` running?"
        code = self.server.poll()
        if code is not None:
            log = f" · log: {self.server.log_path}" if self.server.log_path else ""
            return f"⚠ the server exited with code {code}{log} — press q to quit"
        if self.ever_connected:
            return f"⚠ lost the server at {url} ({detail})"
        return f"starting the server (pid {self.server.pid}) at {url}, loading the model…"

    def server_exited(self) -> bool:
        return self.server is not None and self.server.poll() is not None

    def set_banner(self, message: str) -> None:
        self.banner.set_message(message)

    # -- rendering --------------------------------------------------------------------------

    def view(self) -> View:
        return View(
            stats=self.stats,
            trends=self.trends,
            system=merge(self.stats.system, self.local_system),
            url=self.feed.url,
            connected=self.connected,
            paused=self.paused,
        )

    def render_view(self, force: bool = False) -> None:
        """Show the latest data; while paused only the header changes (to say so).
        `force` redraws the paused view too (the table colours follow the theme)."""
        if self.paused and force:
            for table in self.tables:
                table.show(table.view)
        if self.paused:
            self.header.show(replace(self.header.view, paused=True, connected=self.connected))
            return
        self._rendered_at = time.monotonic()
        view = self.view()
        for panel in self.panels:
            panel.show(view)
        for table in self.tables:
            table.show(view)

    def sample_system(self) -> None:
        try:
            self.local_system = self.probe.sample()
        except Exception:  # noqa: BLE001 - psutil hiccups must not kill the dashboard
            self.local_system = SystemSample(source="none")
        if not self.paused:
            self.status.show(self.view())
        if self.server is not None and not self.connected and not self.auth_failed:
            self.set_banner(self.waiting_message("not answering yet"))

    # -- actions ------------------------------------------------------------------------------

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.render_view()
        self.notify("updates paused — p resumes" if self.paused else "updates resumed")

    def action_chat(self) -> None:
        self.push_screen("chat")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_toggle_theme(self) -> None:
        self.theme = THEMES[1] if self.theme == THEMES[0] else THEMES[0]

    def action_flush(self) -> None:
        self.run_worker(self.flush(), group="flush", exclusive=True, exit_on_error=False)

    async def flush(self) -> None:
        try:
            message = await self.api.flush_cache()
        except ApiError as e:
            self.notify(str(e), title="Cache not flushed", severity="warning", markup=False)
            return
        self.notify(message, title="Cache", markup=False)

    async def model_name(self) -> str:
        """The served model id for chat requests (from the stats, else GET /v1/models)."""
        if self._model is None:
            self._model = await self.api.first_model()
        return self._model or "default"
