"""The dashboard's text panels: header, banner, KV memory, hit rate, throughput, status line.

Each panel keeps the latest `View` and renders it at its current size, so bars and sparklines
fill whatever width the terminal gives them. Colours are theme variables (`$text-success`, ...)
that Textual resolves for dark and light themes alike; glyphs differ too, for monochrome.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from textual.content import Content
from textual.markup import escape
from textual.widget import Widget

from localradix.tui import fmt
from localradix.tui.spark import bar_cells, spark_rows
from localradix.tui.stats import Stats
from localradix.tui.system import SystemSample
from localradix.tui.trends import Trends

USED, CACHED, FREE = "$text-warning", "$text-success", "$text-muted"


@dataclass
class View:
    """Everything a panel may show; the app builds one per update."""

    stats: Stats = field(default_factory=Stats)
    trends: Trends = field(default_factory=Trends)
    system: SystemSample = field(default_factory=SystemSample)
    url: str = ""
    connected: bool = False
    paused: bool = False


class Panel(Widget):
    """A widget that renders `lines(view, width)` as markup."""

    DEFAULT_CSS = "Panel { height: auto; }"

    def __init__(self, title: str = "", **kw) -> None:
        super().__init__(**kw)
        self.view = View()
        if title:
            self.border_title = title

    def show(self, view: View) -> None:
        self.view = view
        self.refresh(layout=False)

    def render(self) -> Content:
        width = max(self.content_size.width, 1)
        return Content.from_markup("\n".join(self.lines(self.view, width)))

    def lines(self, view: View, width: int) -> list[str]:
        raise NotImplementedError


class HeaderBar(Panel):
    def lines(self, view: View, width: int) -> list[str]:
        m = view.stats.model
        if view.paused:
            state = "[reverse $text-warning] PAUSED [/]"
        elif view.connected:
            state = "[$text-success]● live[/]"
        else:
            state = "[$text-error]○ offline[/]"
        if view.url:  # the address actually served (not always :8000, see tui/main.py)
            state = f"{escape(view.url.removeprefix('http://'))} {state}"
        hw = " · ".join(escape(fmt.text(m.get(k), 12)) for k in ("backend", "device", "dtype"))
        up = f"up {fmt.uptime(view.stats.uptime_s)}"
        room = width - _width(state) - 1
        for brand, name_width in (("[b]localradix[/]", 28), ("", 28), ("", 16)):
            name = escape(fmt.text(m.get("name"), name_width))
            left = " │ ".join(p for p in (brand, name, hw, up) if p)
            if _width(left) <= room:
                break
        gap = width - _width(left) - _width(state)
        return [f"{left}{' ' * max(gap, 1)}{state}"]


class Banner(Panel):
    """Shown only while the server cannot be reached."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.message = ""

    def set_message(self, message: str) -> None:
        if message == self.message and self.display == bool(message):
            return
        self.message = message
        self.display = bool(message)
        self.refresh()

    def lines(self, view: View, width: int) -> list[str]:
        return [escape(self.message)]


class KvPanel(Panel):
    def show(self, view: View) -> None:
        self.border_subtitle = memory_split(view.stats.model)  # on the border: no extra row
        super().show(view)

    def lines(self, view: View, width: int) -> list[str]:
        s = view.stats
        used, cached, free = s.get("kv_used"), s.get("kv_cached"), s.get("kv_free")
        total = s.get("kv_total")
        pinned = s.get("kv_pinned")  # part of "used": prefixes kept by cache_control
        held = f" · {fmt.count(pinned)} pinned" if pinned else ""
        snaps = s.get("snapshots")  # recurrent models: state snapshots at cached prefixes
        if snaps:
            held += f" · {fmt.count(snaps)} snapshots ({fmt.count(s.get('snapshot_hits'))} hits)"
        self.border_title = f"KV memory · {fmt.count(total)}{held}"
        cells = bar_cells([used, cached, free], width)
        bar = "".join(
            f"[{style}]{glyph * n}[/]"
            for style, glyph, n in zip((USED, CACHED, FREE), "█▓░", cells, strict=True)
            if n
        )
        bar = bar or f"[{FREE}]{'░' * width}[/]"

        def row(style: str, glyph: str, label: str, v: float | None) -> str:
            share = v / total if v is not None and total else None
            return f"[{style}]{glyph}[/] {label:<7}{fmt.count(v):>7} {fmt.pct(share):>5}"

        return [
            bar,
            row(USED, "█", "used", used),
            row(CACHED, "▓", "cached", cached),
            row(FREE, "░", "free", free),
        ]


def memory_split(model: Mapping[str, Any]) -> str:
    """ "weights 110M · KV 720M": the resident weights and the KV pool, apart ("" if unknown)."""
    weights, kv = model.get("weight_bytes"), model.get("kv_bytes")
    if fmt.number(weights) is None and fmt.number(kv) is None:
        return ""  # an older server: say nothing rather than two dashes
    return f"weights {fmt.gib(weights)} · KV {fmt.gib(kv)}"


class HitRatePanel(Panel):
    """Now (last 5 s) and lifetime; the plot has one column per second that admitted prompts,
    so a burst stays readable after the server goes idle."""

    def lines(self, view: View, width: int) -> list[str]:
        s, t = view.stats, view.trends
        busy = [v for v in t.hit_series() if v is not None]
        if t.hit_rate_now is not None:
            now = f"now [b $text-success]{fmt.pct(t.hit_rate_now)}[/]"
        elif busy:
            now = f"[dim]last[/] [b]{fmt.pct(busy[-1])}[/]"
        else:
            now = "now [dim]idle[/]"
        hit, miss = s.get("cache_hit_tokens"), s.get("cache_miss_tokens")
        return [
            f"{now}  total {fmt.pct(s.hit_rate_total)}",
            *(f"[$text-success]{r}[/]" for r in spark_rows(busy, width, 2, top=1.0)),
            f"[dim]hit {fmt.count(hit)} · miss {fmt.count(miss)}[/]",
        ]


class ThroughputPanel(Panel):
    def lines(self, view: View, width: int) -> list[str]:
        s, t = view.stats, view.trends
        return [
            f"prefill [b]{fmt.rate(s.get('prefill_tokens_per_s'))}[/]",
            f"[$text-primary]{spark_rows(t.prefill_series(), width)[0]}[/]",
            f"decode  [b]{fmt.rate(s.get('decode_tokens_per_s'))}[/]",
            f"[$text-warning]{spark_rows(t.decode_series(), width)[0]}[/]",
        ]


class StatusLine(Panel):
    """Queue, retractions and host figures in one line; less important parts drop first.
    With the cache tiers on (host memory, disk), a second line says what they hold."""

    tier_rows = 1  # the height set so far

    def show(self, view: View) -> None:
        rows = 2 if view.stats.kv_tiers else 1
        if rows != self.tier_rows:  # inline: beats app.tcss's `height: 1`
            self.tier_rows = self.styles.height = rows
        super().show(view)

    def lines(self, view: View, width: int) -> list[str]:
        s, sy = view.stats, view.system
        retr = s.get("retractions")
        retr_style = "$text-error" if retr else "dim"
        parts = [
            f"running [b]{fmt.count(s.get('running'))}[/]",
            f"waiting [b]{fmt.count(s.get('queued'))}[/]",
            f"[{retr_style}]retractions {fmt.count(retr)}[/]",
        ]
        parts += _models(s)
        parts += _speculation(s)
        if sy.source != "none":
            parts.append(f"CPU {fmt.count(sy.cpu_percent)}%")
            parts.append(f"RAM {fmt.gib(sy.ram_used)}/{fmt.gib(sy.ram_total)}")
        if sy.device_total is not None:
            parts.append(f"dev {fmt.gib(sy.device_used)}/{fmt.gib(sy.device_total)}")
        if sy.proc_rss is not None:
            parts.append(f"server {fmt.gib(sy.proc_rss)} {fmt.count(sy.proc_cpu)}%")
        while len(parts) > 3 and _width(" │ ".join(parts)) > width:
            parts.pop()
        return [" │ ".join(parts), *_tiers(s, width)]


def _tiers(s: Stats, width: int) -> list[str]:
    """ "KV tiers host 3.0G · disk 1.2G of 16.0G · 34.2k tokens loaded back (12 requests) ·
    1.30s loading": what the tiers below the radix tree hold and gave back ([] when off)."""
    if not s.kv_tiers:
        return []
    parts = []
    if "host_bytes" in s.kv_tiers:
        parts.append(f"host [b]{fmt.gib(s.tier('host_bytes'))}[/]")
    if "disk_bytes" in s.kv_tiers:
        parts.append(
            f"disk [b]{fmt.gib(s.tier('disk_bytes'))}[/] of {fmt.gib(s.tier('disk_budget'))}"
        )
    loaded, requests = fmt.count(s.tier("promoted_tokens")), fmt.count(s.tier("promotions"))
    parts.append(f"[b]{loaded}[/] tokens loaded back ({requests} requests)")
    for key, what in (("disk_corrupt", "corrupt files"), ("disk_dropped", "writes dropped")):
        if s.tier(key):
            parts.append(f"[$text-warning]{what} {fmt.count(s.tier(key))}[/]")
    parts.append(f"{fmt.seconds(s.tier('load_seconds'))} loading")
    while len(parts) > 1 and _width("KV tiers " + " · ".join(parts)) > width:
        parts.pop()
    return ["[dim]KV tiers[/] " + " · ".join(parts)]


def _models(s: Stats) -> list[str]:
    """The loaded models, once there are several or one is loading, unloading or failed."""
    if len(s.models) < 2 and all(m.get("state") == "ready" for m in s.models):
        return []
    styles = {"loading": "$text-warning", "unloading": "dim", "failed": "$text-error"}
    names = []
    for m in s.models:
        state = str(m.get("state"))
        name = escape(str(m.get("name")))
        names.append(f"[{styles[state]}]{name} {state}[/]" if state in styles else name)
    return [f"models [b]{len(s.models)}[/] " + ", ".join(names)]


def _speculation(s: Stats) -> list[str]:
    """`--speculative`: the accepted share of drafts and tokens per verify step, once drafting."""
    steps, drafted = s.get("spec_verify_steps") or 0, s.get("spec_draft_tokens") or 0
    if not steps or not drafted:
        return []
    accepted = s.get("spec_accepted_tokens") or 0
    per_step = (accepted + steps) / steps
    return [f"spec accept [b]{100 * accepted / drafted:.0f}%[/] {per_step:.1f} tok/step"]


def _width(markup: str) -> int:
    return Content.from_markup(markup).cell_length
