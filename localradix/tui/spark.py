"""Sparklines and bars as plain strings, one column per sample, newest on the right.

Unlike Textual's Sparkline these keep a fixed scale (a hit rate is plotted against 100%, not
against its own minimum) and show a gap for "no data" (idle or disconnected seconds).
"""

from __future__ import annotations

from collections.abc import Sequence

from localradix.tui.fmt import number

EIGHTHS = " ▁▂▃▄▅▆▇█"


def spark_rows(
    values: Sequence[float | None], width: int, height: int = 1, top: float | None = None
) -> list[str]:
    """`height` rows of block characters plotting the last `width` values against `top`
    (default: their maximum). None plots as a blank column, 0 as the lowest bar."""
    if width <= 0 or height <= 0:
        return [""] * max(height, 0)
    shown = list(values)[-width:]
    nums = [number(v) for v in shown]
    scale = top if top is not None else max((v for v in nums if v is not None), default=0.0)
    rows = [[" " * (width - len(shown))] for _ in range(height)]
    for v in nums:
        eighths = _eighths(v, scale, height)
        for r in range(height):  # r = 0 is the top row
            level = eighths - (height - 1 - r) * 8
            if v is None:
                rows[r].append(" ")
            elif r == height - 1 and level <= 0:
                rows[r].append(EIGHTHS[1])  # zero still shows as a floor
            else:
                rows[r].append(EIGHTHS[max(0, min(8, level))])
    return ["".join(r) for r in rows]


def _eighths(v: float | None, scale: float, height: int) -> int:
    if v is None or scale <= 0 or v <= 0:
        return 0
    return max(1, round(min(v / scale, 1.0) * height * 8))


def bar_cells(parts: Sequence[float | None], width: int) -> list[int]:
    """Split `width` cells between `parts` in proportion (largest remainder), each part that
    is non-zero getting at least one cell when there is room."""
    nums = [max(number(p) or 0.0, 0.0) for p in parts]
    total = sum(nums)
    if width <= 0 or total <= 0:
        return [0] * len(nums)
    exact = [n / total * width for n in nums]
    cells = [int(x) for x in exact]
    for i in sorted(range(len(nums)), key=lambda i: exact[i] - cells[i], reverse=True):
        if sum(cells) >= width:
            break
        cells[i] += 1
    for i, n in enumerate(nums):  # a sliver of a part still shows
        if n > 0 and cells[i] == 0:
            donor = max(range(len(cells)), key=lambda j: cells[j])
            if cells[donor] > 1:
                cells[donor] -= 1
                cells[i] = 1
    return cells
