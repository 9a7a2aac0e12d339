"""The dashboard's tables: running batch, largest cached prefixes, recent cache misses.

Rows are updated in place (row i stays row i) so a table keeps its scroll position while the
feed refreshes it several times a second. The last column takes whatever width is left.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from localradix.tui import fmt
from localradix.tui.panels import View
from localradix.tui.stats import first

ID_PREFIXES = ("chatcmpl-", "cmpl-", "req-")


class RowsTable(DataTable):
    """COLUMNS: (key, label, width); width 0 = the flexible last column."""

    COLUMNS: tuple[tuple[str, str, int], ...] = ()
    TITLE = ""
    EMPTY = "none"  # the subtitle while there are no rows

    def __init__(self, **kw: Any) -> None:
        super().__init__(show_cursor=False, zebra_stripes=False, **kw)
        self.view = View()
        self.shown: list[list[tuple]] = []  # what each row's cells show now
        self.border_title = self.TITLE

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            right = key not in ("id", "state", "preview", "why", "lock", "replica")
            self.add_column(
                Text(label, justify="right" if right else "left"), key=key, width=width or 10
            )

    def on_resize(self) -> None:
        self.show(self.view)

    def flex_width(self) -> int:
        fixed = sum(w for _, _, w in self.COLUMNS[:-1]) + 2 * self.cell_padding * len(self.COLUMNS)
        return max(self.content_size.width - fixed - 1, 6)

    def show(self, view: View) -> None:
        self.view = view
        if not self.columns:
            return
        last, _, fixed_width = self.COLUMNS[-1]
        flex = fixed_width or self.flex_width()
        if self.columns[last].width != flex:  # type: ignore[index]
            self.columns[last].width = flex  # type: ignore[index]
            self._require_update_dimensions = True
        self.border_title = self.title_for(view)
        rows = self.rows_for(view, flex)
        self.border_subtitle = "" if rows else self.EMPTY
        self.sync(rows)

    def sync(self, new_rows: Sequence[list[Text]]) -> None:
        """Row i becomes new_rows[i]; only cells whose text or style changed are touched."""
        for i in range(len(new_rows), self.row_count):
            self.remove_row(str(i))
        del self.shown[len(new_rows) :]
        for i, cells in enumerate(new_rows):
            key, seen = str(i), [_signature(c) for c in cells]
            if key not in self.rows:
                self.add_row(*cells, key=key)
                self.shown.append(seen)
                continue
            for j, ((col, _, _), cell) in enumerate(zip(self.COLUMNS, cells, strict=True)):
                if self.shown[i][j] != seen[j]:
                    self.update_cell(key, col, cell)
            self.shown[i] = seen

    def color(self, name: str) -> str:
        """A theme colour usable in Rich styles (`text-success`, ...); '' if unknown."""
        value = self.app.theme_variables.get(name, "")
        return value if value.startswith("#") and len(value) in (4, 7) else ""

    def title_for(self, view: View) -> str:
        return self.TITLE

    def rows_for(self, view: View, flex: int) -> list[list[Text]]:
        raise NotImplementedError


def _signature(cell: Text) -> tuple:
    return (cell.plain, str(cell.style), cell.justify, tuple(cell.spans))


def num(v: Any, render=fmt.count, style: str = "") -> Text:
    return Text(render(v), justify="right", style=style)


def short_id(rid: Any, width: int = 10) -> str:
    """The id's last `width` characters: ids of one server share a head and differ at the end."""
    s = str(rid) if rid is not None else fmt.DASH
    for p in ID_PREFIXES:
        if s.startswith(p) and len(s) > len(p):
            s = s[len(p) :]
            break
    return s[-width:]


def tokens_per_s(row: Mapping[str, Any]) -> float | None:
    """The request's decode speed: reported, else the tokens after the first one over the time
    since the first one (None until there are two)."""
    rate = fmt.number(first(row, "tokens_per_s", "decode_tokens_per_s"))
    if rate is not None:
        return rate
    gen, age, ttft = (fmt.number(row.get(k)) for k in ("generated_tokens", "age_s", "ttft_s"))
    if gen is None or age is None or ttft is None or gen < 2 or age - ttft <= 0:
        return None
    return (gen - 1) / (age - ttft)


class BatchTable(RowsTable):
    TITLE = "Running batch"
    EMPTY = "idle"
    COLUMNS = (
        ("id", "id", 10),
        ("state", "state", 8),
        ("prompt", "prompt", 6),
        ("cached", "cached", 6),
        ("gen", "gen", 5),
        ("ttft", "TTFT", 6),
        ("tps", "tok/s", 6),
        ("age", "age", 6),
        ("retr", "retr", 4),
    )
    STATES = {"prefill": "text-warning", "decode": "text-success", "retracted": "text-error"}

    def title_for(self, view: View) -> str:
        s = view.stats
        return (
            f"Running batch · {fmt.count(s.get('running'))} running · "
            f"{fmt.count(s.get('queued'))} waiting"
        )

    def rows_for(self, view: View, flex: int) -> list[list[Text]]:
        out = []
        for r in view.stats.requests:
            state = fmt.text(r.get("state"), 8)
            out.append(
                [
                    Text(short_id(first(r, "id", "rid"))),
                    Text(state, style=self.color(self.STATES.get(state, "text-muted"))),
                    num(r.get("prompt_tokens")),
                    num(r.get("cached_tokens"), style=self.color("text-success")),
                    num(r.get("generated_tokens")),
                    num(r.get("ttft_s"), fmt.seconds),
                    num(tokens_per_s(r)),
                    num(r.get("age_s"), fmt.seconds),
                    num(
                        r.get("retractions"),
                        style=self.color("text-error") if r.get("retractions") else "",
                    ),
                ]
            )
        return out


class ReplicaTable(RowsTable):
    """Each replica behind an smg gateway: its batch, hit rate and KV (tui/gateway.py)."""

    TITLE = "Replicas"
    COLUMNS = (
        ("replica", "replica", 22),
        ("state", "state", 5),
        ("running", "batch", 5),
        ("queued", "wait", 5),
        ("hits", "hit rate", 8),
        ("kv", "KV used", 0),
    )

    def title_for(self, view: View) -> str:
        s = view.stats
        return f"Replicas · {len(s.replicas)} · routing hit rate {fmt.pct(s.routing_hit_rate)}"

    def rows_for(self, view: View, flex: int) -> list[list[Text]]:
        out = []
        for r in view.stats.replicas:
            up = bool(r.get("up"))
            used, total = fmt.number(r.get("kv_used")), fmt.number(r.get("kv_total"))
            kv = f"{fmt.count(used)}/{fmt.count(total)}"
            if used is not None and total:
                kv += f" ({fmt.pct(used / total)})"
            out.append(
                [
                    Text(fmt.text(str(r.get("url", "")).removeprefix("http://"), 22)),
                    Text(
                        "up" if up else "down",
                        style=self.color("text-success" if up else "text-error"),
                    ),
                    num(r.get("running")),
                    num(r.get("queued")),
                    num(r.get("hit_rate"), fmt.pct),
                    Text(kv, justify="right"),
                ]
            )
        return out


class PrefixTable(RowsTable):
    TITLE = "Radix cache · largest prefixes"
    EMPTY = "empty"
    COLUMNS = (
        ("tokens", "tokens", 6),
        ("hits", "hits", 5),
        ("lock", "lock", 4),
        ("preview", "prefix", 0),
    )

    def rows_for(self, view: View, flex: int) -> list[list[Text]]:
        out = []
        for r in view.stats.top_prefixes:
            locked = first(r, "locked", "lock_ref", "lock_refs")
            is_locked = bool(locked) and locked is not False
            lock = Text(
                "●" if is_locked else "○", style=self.color("text-warning") if is_locked else "dim"
            )
            if isinstance(locked, int) and not isinstance(locked, bool) and locked > 1:
                lock.append(f"{locked}")
            preview = first(r, "preview", "text", "prefix")
            head = r.get("head")
            if preview is None and isinstance(head, (list, tuple)) and head:
                preview = "ids " + " ".join(map(str, head)) + " …"
            out.append(
                [
                    num(first(r, "tokens", "length", "num_tokens")),
                    num(first(r, "hits", "hit_count")),
                    lock,
                    Text(fmt.text(preview, flex), style="" if r.get("preview") else "dim"),
                ]
            )
        return out


class MissTable(RowsTable):
    TITLE = "Cache misses · why"
    EMPTY = "none reported"
    COLUMNS = (("id", "id", 8), ("matched", "cached", 11), ("why", "diverged", 0))

    def rows_for(self, view: View, flex: int) -> list[list[Text]]:
        out = []
        for r in view.stats.recent_misses:
            matched = fmt.number(first(r, "matched_tokens", "cached_tokens"))
            prompt = fmt.number(r.get("prompt_tokens"))
            why = first(r, "reason", "diverged", "divergence", "where", "text", "preview")
            out.append(
                [
                    Text(short_id(first(r, "rid", "id"), 8)),
                    Text(f"{fmt.count(matched)}/{fmt.count(prompt)}", justify="right"),
                    Text(fmt.text(why, flex)),
                ]
            )
        return out
