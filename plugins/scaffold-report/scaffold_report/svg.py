"""Charts as inline SVG: line charts (with interval bands, linear or log x) and bar charts, no library.

Every chart has a title, labelled axes with round tick values, a legend when
it shows several series, and a native tooltip (``<title>``) on each point or
bar. Text is escaped; sizes are in a ``viewBox`` so charts scale with the page.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

#: Colour-blind safe (Okabe and Ito), in the order series take them.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
WIDTH, HEIGHT = 520, 300
MARGIN = {"left": 62, "right": 16, "top": 34, "bottom": 48}


@dataclass
class Series:
    """A line: ``points`` as (x, y); ``band`` as (x, low, high) drawn as a shaded interval."""

    name: str
    points: list[tuple[float, float]]
    band: list[tuple[float, float, float]] = field(default_factory=list)
    color: str | None = None
    dashed: bool = False
    labels: list[str] = field(default_factory=list)  # the tooltip of each point, else "name: x, y"


def _fmt(value: float) -> str:
    """A tick or tooltip number: short, no trailing zeros (1, 0.25, 1.5k, 2M)."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.3g}k"
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (steps of 1, 2 or 5 times a power of ten)."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    start = math.floor(low / step + 1e-9) * step
    ticks: list[float] = []
    value = start
    while value <= high + step * 1e-6 + (1e-12 if step < 1 else 0) or len(ticks) < 2:
        ticks.append(round(value, 12))
        value += step
        if len(ticks) > 50:
            break
    if ticks[-1] < high - 1e-12:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def log_ticks(low: float, high: float, base: int) -> list[float]:
    """Ticks of a log axis covering [low, high]: powers of 2 (base 2) or 1-2-5 times powers of ten (base 10),
    from the last tick at or below ``low`` to the first at or above ``high``."""
    low, high = max(low, 1e-12), max(high, low)
    if base == 2:
        first, last = math.floor(math.log2(low) + 1e-9), math.ceil(math.log2(high) - 1e-9)
        return [2.0 ** e for e in range(first, max(last, first + 1) + 1)]
    candidates = [m * 10.0 ** e for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
                  for m in (1, 2, 5)]
    below = max(c for c in candidates if c <= low * 1.0001)
    above = min(c for c in candidates if c >= high / 1.0001)
    ticks = [c for c in candidates if below <= c <= above]
    return ticks if len(ticks) >= 2 else [below, below * 10]


class _Axes:
    """Maps data to pixels in the plot area of one chart."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], log_x: int, y_range: tuple[float, float] | None,
                 width: int, height: int, integer_x: bool = False):
        self.log_x = log_x
        self.left, self.top = MARGIN["left"], MARGIN["top"]
        self.right, self.bottom = width - MARGIN["right"], height - MARGIN["bottom"]
        xs = [x for x in xs if math.isfinite(x) and (x > 0 or not log_x)] or [1.0]
        ys = [y for y in ys if math.isfinite(y)] or [0.0, 1.0]
        if log_x:
            self.x_ticks = log_ticks(min(xs), max(xs), log_x)
        else:
            self.x_ticks = nice_ticks(min(xs), max(xs), 6)
            if integer_x:  # counts (optimizer steps): no tick at 1.5
                whole = sorted({float(math.ceil(t - 1e-9)) for t in self.x_ticks})
                self.x_ticks = whole if len(whole) >= 2 else [whole[0], whole[0] + 1]
        if y_range is not None:
            self.y_ticks = nice_ticks(*y_range, 5)
        else:
            low, high = min(ys), max(ys)
            low = min(low, 0.0) if low >= 0 and high > 0 and low < high * 0.5 else low
            self.y_ticks = nice_ticks(low, high, 5)
        self.x_low, self.x_high = self._tx(self.x_ticks[0]), self._tx(self.x_ticks[-1])
        self.y_low, self.y_high = self.y_ticks[0], self.y_ticks[-1]

    def _tx(self, x: float) -> float:
        return math.log(x, self.log_x) if self.log_x else x

    def x(self, value: float) -> float:
        span = (self.x_high - self.x_low) or 1.0
        return self.left + (self._tx(value) - self.x_low) / span * (self.right - self.left)

    def y(self, value: float) -> float:
        span = (self.y_high - self.y_low) or 1.0
        return self.bottom - (value - self.y_low) / span * (self.bottom - self.top)


def _frame(axes: _Axes, title: str, x_label: str, y_label: str, width: int, height: int,
           x_ticks: bool = True) -> list[str]:
    """Title, grid, ticks and axis labels (``x_ticks`` False: the caller labels the x axis itself)."""
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" '
           f'xmlns="http://www.w3.org/2000/svg">', f"<title>{escape(title)}</title>",
           f'<text class="chart-title" x="{axes.left}" y="18">{escape(title)}</text>']
    for tick in axes.y_ticks:
        y = axes.y(tick)
        out.append(f'<line class="grid" x1="{axes.left}" x2="{axes.right}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{axes.left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(tick)}</text>')
    for tick in axes.x_ticks if x_ticks else []:
        x = axes.x(tick)
        label = _fmt(tick)
        out.append(f'<line class="grid grid-x" x1="{x:.1f}" x2="{x:.1f}" y1="{axes.top}" y2="{axes.bottom}"/>')
        out.append(f'<text class="tick" x="{x:.1f}" y="{axes.bottom + 16}" text-anchor="middle">'
                   f"{escape(label)}</text>")
    out.append(f'<line class="axis" x1="{axes.left}" x2="{axes.right}" y1="{axes.bottom}" y2="{axes.bottom}"/>')
    out.append(f'<line class="axis" x1="{axes.left}" x2="{axes.left}" y1="{axes.top}" y2="{axes.bottom}"/>')
    out.append(f'<text class="axis-label" x="{(axes.left + axes.right) / 2:.1f}" y="{height - 8}" '
               f'text-anchor="middle">{escape(x_label)}</text>')
    mid = (axes.top + axes.bottom) / 2
    out.append(f'<text class="axis-label" transform="translate(14 {mid:.1f}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    return out


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, log_x: int = 0,
               y_range: tuple[float, float] | None = None, width: int = WIDTH, height: int = HEIGHT,
               markers: bool = True, legend: bool | None = None, integer_x: bool = False) -> str:
    """Lines (with their bands) on shared axes; ``log_x`` 2 or 10 for a log x axis; a legend when there are
    several series (or ``legend`` says so)."""
    xs = [x for s in series for x, _ in s.points] + [b[0] for s in series for b in s.band]
    ys = [y for s in series for _, y in s.points] + [v for s in series for b in s.band for v in b[1:]]
    axes = _Axes(xs, ys, log_x, y_range, width, height, integer_x)
    out = _frame(axes, title, x_label, y_label, width, height)
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        band = [b for b in s.band if all(math.isfinite(v) for v in b)]
        if band:
            upper = " ".join(f"{axes.x(x):.1f},{axes.y(hi):.1f}" for x, _, hi in band)
            lower = " ".join(f"{axes.x(x):.1f},{axes.y(lo):.1f}" for x, lo, _ in reversed(band))
            out.append(f'<polygon class="band" points="{upper} {lower}" fill="{color}"/>')
        points = [(x, y) for x, y in s.points if math.isfinite(y) and (x > 0 or not log_x)]
        if points:
            path = " ".join(f"{'M' if j == 0 else 'L'}{axes.x(x):.1f},{axes.y(y):.1f}"
                            for j, (x, y) in enumerate(points))
            dash = ' stroke-dasharray="5 4"' if s.dashed else ""
            out.append(f'<path class="line" d="{path}" stroke="{color}"{dash}/>')
        if markers and len(points) <= 64:
            for j, (x, y) in enumerate(points):
                tip = s.labels[j] if j < len(s.labels) else f"{s.name}: x={_fmt(x)}, y={_fmt(y)}"
                out.append(f'<circle class="point" cx="{axes.x(x):.1f}" cy="{axes.y(y):.1f}" r="3.2" fill="{color}">'
                           f"<title>{escape(tip)}</title></circle>")
    if legend or (legend is None and len(series) > 1):
        out.extend(_legend([(s.name, s.color or PALETTE[i % len(PALETTE)], s.dashed) for i, s in enumerate(series)],
                           axes))
    out.append("</svg>")
    return "\n".join(out)


def _legend(entries: list[tuple[str, str, bool]], axes: _Axes) -> list[str]:
    width = 34 + 6.6 * max(len(name) for name, _, _ in entries)
    out = [f'<g class="legend" transform="translate({axes.left + 8} {axes.top + 4})">',
           f'<rect class="legend-box" x="-4" y="-3" width="{width:.0f}" height="{16 * len(entries) + 4}" rx="4"/>']
    for i, (name, color, dashed) in enumerate(entries):
        y = i * 16
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        out.append(f'<line x1="0" x2="18" y1="{y + 6}" y2="{y + 6}" stroke="{color}" stroke-width="2.5"{dash}/>')
        out.append(f'<text x="24" y="{y + 10}">{escape(name)}</text>')
    out.append("</g>")
    return out


def bar_chart(labels: Sequence[str], values: Sequence[float], *, title: str, x_label: str, y_label: str,
              tips: Sequence[str] | None = None, colors: Sequence[str] | None = None, width: int = WIDTH,
              height: int = HEIGHT) -> str:
    """Vertical bars, one per label (category names, or bin ranges of a histogram)."""
    axes = _Axes([0.0, 1.0], [0.0, *values], 0, None, width, height)
    out = _frame(axes, title, x_label, y_label, width, height, x_ticks=False)
    count = max(1, len(values))
    slot = (axes.right - axes.left) / count
    gap = min(8.0, slot * 0.18)
    every = max(1, math.ceil(count / 12))  # at most about 12 labels under the axis
    for i, value in enumerate(values):
        x = axes.left + i * slot + gap / 2
        top = axes.y(value)
        color = (colors[i] if colors and i < len(colors) else None) or PALETTE[0]
        tip = tips[i] if tips and i < len(tips) else f"{labels[i]}: {_fmt(value)}"
        out.append(f'<rect class="bar" x="{x:.1f}" y="{top:.1f}" width="{max(1.0, slot - gap):.1f}" '
                   f'height="{max(0.0, axes.bottom - top):.1f}" fill="{color}"><title>{escape(tip)}</title></rect>')
        if i % every == 0:
            out.append(f'<text class="tick" x="{x + (slot - gap) / 2:.1f}" y="{axes.bottom + 16}" '
                       f'text-anchor="middle">{escape(labels[i])}</text>')
    out.append("</svg>")
    return "\n".join(out)


def histogram_bins(values: Sequence[float], bins: int = 20, distinct_max: int = 12
                   ) -> tuple[list[str], list[int], list[str], list[float]]:
    """(labels, counts, tooltips, lower edges) of ``values``: one bar per distinct value when there are at
    most ``distinct_max`` (0/1 rewards), else about ``bins`` bins of a round width."""
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return [], [], [], []
    distinct = sorted(set(finite))
    if len(distinct) <= distinct_max:
        tally = Counter(finite)  # counted in C (0.0 and -0.0 are one value, as distinct has them)
        counts = [tally[d] for d in distinct]
        labels = [_fmt(d) for d in distinct]
        return labels, counts, [f"{label}: {c:,}" for label, c in zip(labels, counts)], distinct
    ticks = nice_ticks(finite[0], finite[-1], bins)  # round bin edges: 0, 10, 20, ... not 62.3, 67.7, ...
    width = ticks[1] - ticks[0]
    start = ticks[0]
    count = max(1, math.floor((finite[-1] - start) / width) + 1)
    counts = [0] * count
    for v in finite:
        counts[min(count - 1, int((v - start) / width))] += 1
    edges = [start + i * width for i in range(count + 1)]
    labels = [_fmt(edges[i]) for i in range(count)]
    tips = [f"[{_fmt(edges[i])}, {_fmt(edges[i + 1])}): {counts[i]:,}" for i in range(count)]
    return labels, counts, tips, edges[:-1]


def grouped_bar_chart(categories: Sequence[str], series: Sequence[tuple[str, Sequence[float | None]]], *, title: str,
                      x_label: str, y_label: str, value_format: str = "{:.3g}", width: int = WIDTH,
                      height: int = HEIGHT) -> str:
    """Bars side by side: one group per category, one bar per series in it (a legend names the series); a
    missing value (None) leaves its bar out."""
    values = [v for _, vs in series for v in vs if v is not None and math.isfinite(v)]
    headroom = 1.0 + 0.08 * len(series) if len(series) > 1 else 1.0  # room for the legend above the bars
    axes = _Axes([0.0, 1.0], [0.0, *values, max(values, default=0.0) * headroom], 0, None, width, height)
    out = _frame(axes, title, x_label, y_label, width, height, x_ticks=False)
    groups = max(1, len(categories))
    slot = (axes.right - axes.left) / groups
    gap = min(12.0, slot * 0.2)
    bar = max(1.0, (slot - gap) / max(1, len(series)))
    for g, category in enumerate(categories):
        x0 = axes.left + g * slot + gap / 2
        for i, (name, vs) in enumerate(series):
            value = vs[g] if g < len(vs) else None
            if value is None or not math.isfinite(value):
                continue
            top = axes.y(value)
            color = PALETTE[i % len(PALETTE)]
            tip = f"{name}, {category}: {value_format.format(value)}"
            out.append(f'<rect class="bar" x="{x0 + i * bar:.1f}" y="{top:.1f}" width="{max(1.0, bar - 1):.1f}" '
                       f'height="{max(0.0, axes.bottom - top):.1f}" fill="{color}"><title>{escape(tip)}</title></rect>')
        out.append(f'<text class="tick" x="{x0 + (slot - gap) / 2:.1f}" y="{axes.bottom + 16}" '
                   f'text-anchor="middle">{escape(category)}</text>')
    if len(series) > 1:
        out.extend(_legend([(name, PALETTE[i % len(PALETTE)], False) for i, (name, _) in enumerate(series)], axes))
    out.append("</svg>")
    return "\n".join(out)
