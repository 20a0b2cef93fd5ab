"""Small self-contained SVG charts (line and bar) for run reports and Prefect artifacts.

Plain SVG text: no plotting library, no script, no network. Every chart is an ``<svg>``
element with a ``class`` naming its kind and an optional ``id``, so a page (or a test) can
find it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f")
WIDTH, HEIGHT = 520, 280
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 44, 44


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= step * factor:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + k * step for k in range(int((high - first) / step + 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:.4g}"


def _open(kind: str, title: str, chart_id: str | None, height: int) -> list[str]:
    ident = f' id="{escape(chart_id)}"' if chart_id else ""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {kind}"{ident} '
            f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
            f'font-family="sans-serif" font-size="11">',
            f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
            f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="13" '
            f'font-weight="bold">{escape(title)}</text>']


def line_chart(series: dict[str, Sequence[float | None]], *, title: str, x_label: str,
               y_label: str = "", chart_id: str | None = None, x_start: int = 0,
               marker: tuple[int, str] | None = None) -> str:
    """Lines over x = x_start, x_start+1, ... (from 0: a tree is named by its index from 0
    everywhere); ``None`` values leave gaps; ``marker`` (x, label) draws a dashed vertical
    line there (e.g. the last tree early stopping kept)."""
    points = [v for values in series.values() for v in values if v is not None]
    n = max((len(v) for v in series.values()), default=0)
    if not points or n == 0:
        return ""
    low, high = min(points), max(points)
    pad = (high - low) * 0.05 or abs(high) * 0.05 or 1.0
    low, high = low - pad, high + pad
    left, right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
    top, bottom = MARGIN_TOP, HEIGHT - MARGIN_BOTTOM

    def sx(k: int) -> float:
        return left + (right - left) * (k / max(1, n - 1))

    def sy(v: float) -> float:
        return bottom - (bottom - top) * (v - low) / (high - low)

    out = _open("line-chart", title, chart_id, HEIGHT)
    for tick in _ticks(low, high):
        y = sy(tick)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(tick)}</text>')
    for tick in _ticks(x_start, x_start + n - 1, 8):
        if tick != int(tick):
            continue
        x = sx(int(tick) - x_start)
        out.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{int(tick)}</text>')
    out.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#444"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#444"/>')
    out.append(f'<text x="{(left + right) / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    if y_label:
        out.append(f'<text x="14" y="{(top + bottom) / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 14 {(top + bottom) / 2})">{escape(y_label)}</text>')
    for index, (name, values) in enumerate(series.items()):
        colour = PALETTE[index % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for k, v in enumerate(values):
            if v is None:
                runs.append([])
            else:
                runs[-1].append(f"{sx(k):.1f},{sy(v):.1f}")
        for run in runs:
            if len(run) > 1:
                out.append(f'<polyline class="series" data-name="{escape(name)}" fill="none" '
                           f'stroke="{colour}" stroke-width="2" points="{" ".join(run)}"/>')
            elif run:
                cx, cy = run[0].split(",")
                out.append(f'<circle class="series" data-name="{escape(name)}" cx="{cx}" '
                           f'cy="{cy}" r="3" fill="{colour}"/>')
        lx = left + 130 * index  # the legend: one row between the title and the plot
        out.append(f'<rect x="{lx}" y="{top - 18}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{lx + 14}" y="{top - 9}">{escape(name)}</text>')
    if marker is not None and x_start <= marker[0] < x_start + n:
        x = sx(marker[0] - x_start)
        out.append(f'<line class="marker" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" '
                   f'stroke="#444" stroke-dasharray="4 3"/>')
        out.append(f'<text class="marker" x="{x - 4:.1f}" y="{top + 12}" text-anchor="end">'
                   f'{escape(marker[1])}</text>')
    out.append("</svg>")
    return "".join(out)


def bar_chart(bars: Sequence[tuple[str, float]], *, title: str, value_label: str = "",
              chart_id: str | None = None, colour: str = PALETTE[0]) -> str:
    """Horizontal bars, one per (label, value), in the order given."""
    if not bars:
        return ""
    row, label_width = 18, 170
    height = MARGIN_TOP + row * len(bars) + MARGIN_BOTTOM
    left, right = label_width, WIDTH - 70
    most = max(v for _, v in bars) or 1.0
    out = _open("bar-chart", title, chart_id, height)
    for k, (label, value) in enumerate(bars):
        y = MARGIN_TOP + k * row
        width = max(0.0, (right - left) * value / most)
        shown = label if len(label) <= 30 else label[:29] + "\u2026"
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(shown)}</text>')
        out.append(f'<rect class="bar" data-name="{escape(label)}" x="{left}" y="{y + 3}" '
                   f'width="{width:.1f}" height="{row - 6}" fill="{colour}"/>')
        out.append(f'<text x="{left + width + 4:.1f}" y="{y + 14}">{_label(value)}</text>')
    if value_label:
        out.append(f'<text x="{(left + right) / 2}" y="{height - 10}" text-anchor="middle">'
                   f'{escape(value_label)}</text>')
    out.append("</svg>")
    return "".join(out)
