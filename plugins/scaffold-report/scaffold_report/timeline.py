"""Where the time went: every episode's spans, as the report's timeline and a Chrome trace.

:class:`Timeline` takes each episode's spans as the report scans the heads,
a chunk of a few thousand episodes at a time in arrays, and folds each chunk
into figures whose size does not grow with the run: each phase's seconds,
the starts and ends of spans counted and summed per cell of time (4,096
cells, twice as wide whenever the run outgrows them), and a few episodes
kept whole (the slowest, the first to start, the earliest to start in each
of a few hundred cells of the run). From them:

* :func:`timeline_section`: the report's "Time" section: each phase's share
  of the episodes' time, the spans in flight by phase over the run (every
  span, integrated per interval), and a Gantt chart of a few episodes (the
  slowest, and others spread over the run) with each of their spans;
* :func:`write_trace`: the spans in Chrome's trace event format
  (``trace.json``, beside ``report.html``), which Perfetto
  (https://ui.perfetto.dev) and ``chrome://tracing`` open: one row per slot
  of concurrency, one slice per span, the episode's id in each slice's args.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Iterable
from html import escape
from pathlib import Path
from typing import Any, NamedTuple

from scaffold_core.spans import PHASES, exclusive

from .svg import HEIGHT, MARGIN, PALETTE, WIDTH, _fmt, nice_ticks

#: A colour per phase (the palette's, colour-blind safe), and one for the time no span covers.
PHASE_COLORS = {"queued": "#999999", "prefill": PALETTE[4], "decode": PALETTE[0], "generate": PALETTE[5],
                "weight_wait": PALETTE[1], "tool": PALETTE[3], "verify": PALETTE[2], "await": "#7d6b5d",
                "other": "#d9dde3"}
#: Episodes the Gantt chart draws, and how many of them are the slowest.
GANTT_EPISODES = 40
GANTT_SLOWEST = 10
#: Intervals of the "in flight" chart.
BINS = 120
#: Episodes ``trace.json`` holds at most by default (the first to start; ``scaffold report --trace-episodes``
#: for more): about 130 bytes a span. Writing it is per-episode work at the end of every run, so the default
#: is a few thousand.
TRACE_EPISODES = 2_000
#: A timeline folds the episodes it took in once a chunk holds this many of them, or this many spans.
CHUNK_EPISODES = 8_192
CHUNK_SPANS = 262_144
#: Cells of time the starts and ends of spans are counted in (the in-flight chart's intervals are made of them),
#: and cells of the run the Gantt chart's spread episodes come from (the earliest to start in each).
FLIGHT_CELLS = 4_096
SPREAD_CELLS = 256


def phase_color(phase: str) -> str:
    return PHASE_COLORS.get(phase, PALETTE[6])


class Episode(NamedTuple):
    """One episode the timeline keeps whole (for the Gantt chart and ``trace.json``)."""

    began: float  # its start (its first span's, when that is earlier)
    ended: float
    order: int  # its place among the episodes added
    id: str
    spans: list[tuple[str, float, float, str]]  # (phase, start, end, name; "" when none)

    @property
    def took(self) -> float:
        return self.ended - self.began


def _by_start(episode: Episode) -> tuple[float, int]:
    """The order of episodes by their start (ties: in the order added)."""
    return episode.began, episode.order


class _Grid:
    """``cells`` cells of equal width over a growing extent ``[origin, origin + cells * width)``: :meth:`cover`
    doubles the width (two neighbouring cells become one, the old extent one half of the new) until an
    interval fits, and returns how to map the old cells (so every sum kept per cell stays exact)."""

    def __init__(self, cells: int) -> None:
        self.cells = cells
        self.origin = 0.0
        self.width = 0.0  # 0: no extent yet

    def cover(self, low: float, high: float) -> list[bool]:
        """Grow until ``[low, high]`` fits; one entry per doubling: True when the old extent became the upper
        half (the extent grew downwards)."""
        if not self.width:
            self.origin = low
            self.width = max((high - low) / (self.cells // 2), 1e-6)  # the first values fill half the cells
            return []
        steps = []
        while low < self.origin or high >= self.origin + self.cells * self.width:
            down = low < self.origin
            if down:
                self.origin -= self.cells * self.width
            self.width *= 2
            steps.append(down)
        return steps

    def index(self, values: Any) -> Any:
        """The cell of each value (a numpy array), clipped to the extent."""
        import numpy as np

        return np.clip(((values - self.origin) / self.width).astype(np.int64), 0, self.cells - 1)

    @staticmethod
    def halve(array: Any, down: bool) -> Any:
        """``array`` (cells last) after one doubling of the width."""
        import numpy as np

        n = array.shape[-1]
        merged = array.reshape(*array.shape[:-1], n // 2, 2).sum(axis=-1)
        out = np.zeros_like(array)
        if down:
            out[..., n // 2:] = merged
        else:
            out[..., :n // 2] = merged
        return out


class Timeline:
    """Where the episodes' time went, in bounded memory (see the module's docstring): episodes are taken in
    a chunk at a time and folded into running sums and a few kept episodes."""

    def __init__(self, keep: int = TRACE_EPISODES) -> None:
        """``keep``: the episodes kept whole for ``trace.json`` (the first to start; see :data:`TRACE_EPISODES`)."""
        self.keep = keep
        self.phases: list[str] = []  # the phase of each code
        self._codes: dict[str, int] = {}
        self.names: list[str] = [""]  # the names spans carry (a tool's), by code; 0: none
        self._name_codes: dict[str, int] = {"": 0}
        self.episodes = 0  # added so far (folded or not)
        self._chunk()
        self._parts: dict[str, float] = {}  # {phase: seconds} and the total, as metrics.json's time_shares
        self._total = 0.0
        self._low, self._high = math.inf, -math.inf  # the first span's start, the last one's end
        self._flight = _Grid(FLIGHT_CELLS)  # per phase: starts and ends per cell, counted and summed
        self._flows: Any = None  # numpy array (phases, 4, cells)
        self._spread = _Grid(SPREAD_CELLS)  # the earliest episode to start in each cell (the Gantt's picks)
        self._cells: list[Episode | None] = [None] * SPREAD_CELLS
        self._slowest: list[Episode] = []
        self._earliest: list[Episode] = []  # the first ``keep`` to start

    def _chunk(self) -> None:
        self.kind = array("h")  # per span: its phase's code
        self.name = array("i")  # per span: its name's code
        self.start = array("d")
        self.end = array("d")
        self.first = array("q")  # per episode: its first span's place in the span arrays
        self.began = array("d")
        self.ended = array("d")
        self.ids: list[str] = []

    def __len__(self) -> int:
        return self.episodes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timeline):
            return NotImplemented
        return self._state() == other._state()

    def _state(self) -> tuple[Any, ...]:
        """Everything the figures come from (every chunk folded)."""
        self._fold()
        flows = None if self._flows is None else self._flows.tolist()
        grids = [(g.origin, g.width) for g in (self._flight, self._spread)]
        return (self.keep, self.phases, self.names, self.episodes, self._parts, self._total, self._low, self._high,
                flows, grids, self._slowest, self._earliest, self._cells)

    __hash__ = None  # type: ignore[assignment]

    def add(self, head: dict[str, Any]) -> None:
        """An episode's head (no-op when it recorded no spans)."""
        spans = head.get("spans")
        if type(spans) is not list:
            return
        started, wall = head.get("started_s"), head.get("wall_s")
        if type(started) is not float:
            started = float(started) if isinstance(started, (int, float)) else 0.0
        if type(wall) is not float:
            wall = float(wall) if isinstance(wall, (int, float)) else 0.0
        codes, kind, start, end = self._codes, self.kind, self.start, self.end
        first = len(kind)
        began, ended = started, started + wall  # widened to the spans (a queued one starts before the episode)
        try:  # the usual case (per episode, so kept lean): every span (phase, start, end), its phase seen before
            for phase, a, b in spans:
                kind.append(codes[phase])
                start.append(a)
                end.append(b)
                if a < began:
                    began = a
                if b > ended:
                    ended = b
            self.name.frombytes(bytes(self.name.itemsize * len(spans)))  # every name code 0
        except (KeyError, TypeError, ValueError):  # a named span, a new phase, or one that is no span
            del kind[first:], start[first:], end[first:]
            kinds, labels, starts, ends = self._columns(spans)
            try:
                start.extend(starts)
                end.extend(ends)
            except TypeError:  # a span that is no (phase, start, end): the episode is left out
                del start[first:], end[first:]
                return
            kind.extend(kinds)
            self.name.extend(labels)
            if starts:
                began, ended = min(began, min(starts)), max(ended, max(ends))
        self.first.append(first)
        self.began.append(began)
        self.ended.append(ended)
        episode_id = head.get("episode_id", "")
        self.ids.append(episode_id if type(episode_id) is str else str(episode_id))
        self.episodes += 1
        if len(self.first) >= CHUNK_EPISODES or len(kind) >= CHUNK_SPANS:
            self._fold()

    def _columns(self, spans: list[Any]) -> tuple[list[int], list[int], list[Any], list[Any]]:
        """(phase codes, name codes, starts, ends) of ``spans``, new phases and names given codes."""
        codes, names = self._codes, self._name_codes
        kinds, labels, starts, ends = [], [], [], []
        for item in spans:
            code = codes.get(item[0])
            if code is None:
                code = codes[item[0]] = len(self.phases)
                self.phases.append(str(item[0]))
            kinds.append(code)
            starts.append(item[1])
            ends.append(item[2])
            if len(item) > 3:
                label = str(item[3])
                name = names.get(label)
                if name is None:
                    name = names[label] = len(self.names)
                    self.names.append(label)
                labels.append(name)
            else:
                labels.append(0)
        return kinds, labels, starts, ends

    # -- folding a chunk into the running figures ---------------------------------------------------------

    def _fold(self) -> None:
        """Fold the chunk of episodes taken in since the last fold into the running figures, and start a new one."""
        import numpy as np

        n = len(self.first)
        if not n:
            return
        kind = np.frombuffer(self.kind, dtype=np.int16)
        start = np.frombuffer(self.start, dtype=np.float64)
        end = np.frombuffer(self.end, dtype=np.float64)
        first = np.frombuffer(self.first, dtype=np.int64)
        began = np.frombuffer(self.began, dtype=np.float64)
        ended = np.frombuffer(self.ended, dtype=np.float64)
        counts = np.diff(np.append(first, len(kind)))
        self._fold_shares(kind, start, end, first, counts, began, ended)
        if len(kind):
            self._fold_flight(kind, start, end)
        order = np.arange(self.episodes - n, self.episodes)
        self._fold_kept(began, ended, order)
        self._chunk()

    def _fold_shares(self, kind: Any, start: Any, end: Any, first: Any, counts: Any, began: Any,
                     ended: Any) -> None:
        """Each phase's seconds as :func:`scaffold_core.spans.exclusive` divides an episode's time: in bulk for
        the usual episode (its spans one after another), one by one for the others."""
        import numpy as np

        n = len(first)
        owner = np.repeat(np.arange(n), counts)
        took = end - start
        # an episode is usual when no span ends before it starts and each starts at or after the one before ends
        bad = took < 0
        follows = np.ones(len(kind), dtype=bool)
        if len(kind) > 1:
            follows[1:] = start[1:] >= end[:-1]
        follows[first[counts > 0]] = True  # an episode's first span follows nothing
        irregular = np.bincount(owner, weights=bad | ~follows, minlength=n) > 0
        timed = ended > began
        usual = timed & ~irregular
        spans = usual[owner]
        if spans.any():
            seconds = np.bincount(kind[spans], weights=took[spans], minlength=len(self.phases))
            covered = np.bincount(owner[spans], weights=took[spans], minlength=n)
            rest = np.where(usual, ended - began - covered, 0.0)
            for code, value in enumerate(seconds.tolist()):
                if value:
                    phase = self.phases[code]
                    self._parts[phase] = self._parts.get(phase, 0.0) + value
            other = float(rest[rest > 0].sum())
            if other:
                self._parts["other"] = self._parts.get("other", 0.0) + other
            self._total += float((ended - began)[usual].sum())
        for episode in np.flatnonzero(timed & irregular).tolist():
            b, e = float(began[episode]), float(ended[episode])
            self._total += e - b
            for phase, value in exclusive(self._spans(episode), b, e).items():
                self._parts[phase] = self._parts.get(phase, 0.0) + value

    def _fold_flight(self, kind: Any, start: Any, end: Any) -> None:
        """Starts and ends of spans per cell of time and phase: count and sum (what :meth:`in_flight` integrates)."""
        import numpy as np

        grid = self._flight
        low, high = float(start.min()), float(max(end.max(), start.max()))
        self._low, self._high = min(self._low, low), max(self._high, high)
        phases, cells = len(self.phases), grid.cells
        flows = self._flows
        for down in grid.cover(self._low, self._high):
            flows = _Grid.halve(flows, down) if flows is not None else None
        if flows is None:
            flows = np.zeros((phases, 4, cells))
        elif flows.shape[0] < phases:
            flows = np.concatenate([flows, np.zeros((phases - flows.shape[0], 4, cells))])
        at_start, at_end = grid.index(start), grid.index(end)
        key_start, key_end = kind.astype(np.int64) * cells + at_start, kind.astype(np.int64) * cells + at_end
        size = phases * cells
        flows[:, 0] += np.bincount(key_start, minlength=size).reshape(phases, cells)
        flows[:, 1] += np.bincount(key_start, weights=start, minlength=size).reshape(phases, cells)
        flows[:, 2] += np.bincount(key_end, minlength=size).reshape(phases, cells)
        flows[:, 3] += np.bincount(key_end, weights=end, minlength=size).reshape(phases, cells)
        self._flows = flows

    def _fold_kept(self, began: Any, ended: Any, order: Any) -> None:
        """The slowest episodes, the first to start and the earliest to start in each cell of the run: kept whole."""
        import numpy as np

        took = ended - began
        slowest = np.lexsort((order, -took))[:GANTT_SLOWEST]
        if len(self._slowest) >= GANTT_SLOWEST:  # only those that beat the slowest kept
            least = self._slowest[-1].took
            slowest = slowest[took[slowest] > least]
        if len(slowest):
            self._slowest = sorted(self._slowest + [self._episode(i) for i in slowest.tolist()],
                                   key=lambda e: (-e.took, e.order))[:GANTT_SLOWEST]
        if self.keep > 0:
            earliest = np.lexsort((order, began))[:self.keep]
            if len(self._earliest) >= self.keep:
                earliest = earliest[began[earliest] < self._earliest[-1].began]
            if len(earliest):
                self._earliest = sorted(self._earliest + [self._episode(i) for i in earliest.tolist()],
                                        key=_by_start)[:self.keep]
        grid = self._spread
        for down in grid.cover(float(began.min()), float(began.max())):
            held, self._cells = self._cells, [None] * grid.cells
            half = grid.cells // 2
            for i in range(0, grid.cells, 2):
                pair = [e for e in held[i:i + 2] if e is not None]
                self._cells[half * down + i // 2] = min(pair, key=_by_start) if pair else None
        cell = grid.index(began)
        ranked = np.lexsort((order, began, cell))
        firsts = ranked[np.flatnonzero(np.diff(np.append(-1, cell[ranked])))]  # the earliest in each cell
        for i in firsts.tolist():
            held_one = self._cells[int(cell[i])]
            if held_one is None or (float(began[i]), int(order[i])) < _by_start(held_one):
                self._cells[int(cell[i])] = self._episode(i)

    def _spans(self, episode: int) -> list[tuple[str, float, float, str]]:
        """(phase, start, end, name) of the ``episode``-th episode of the chunk."""
        stop = self.first[episode + 1] if episode + 1 < len(self.first) else len(self.kind)
        return [(self.phases[self.kind[i]], self.start[i], self.end[i], self.names[self.name[i]])
                for i in range(self.first[episode], stop)]

    def _episode(self, episode: int) -> Episode:
        return Episode(self.began[episode], self.ended[episode], self.episodes - len(self.first) + episode,
                       self.ids[episode], self._spans(episode))

    # -- the figures --------------------------------------------------------------------------------------

    def shares(self) -> tuple[dict[str, float], float]:
        """({phase: seconds}, total seconds) of the episodes' time, divided as ``metrics.json``'s ``time_shares``
        (:func:`scaffold_core.spans.exclusive`)."""
        self._fold()
        return dict(self._parts), self._total

    def in_flight(self, bins: int = BINS) -> tuple[list[float], dict[str, list[float]]]:
        """(interval edges, {phase: mean number of its spans in flight in each interval}) over the run: at most
        ``bins`` intervals, their edges on the cells the spans were counted in (so each mean is exact)."""
        import numpy as np

        self._fold()
        flows, grid = self._flows, self._flight
        if flows is None:
            return [], {}
        low = int(grid.index(np.array([self._low]))[0])
        high = int(grid.index(np.array([self._high]))[0]) + 1
        group = -(-(high - low) // bins)
        stop = low + group * -(-(high - low) // group)
        edges_at = np.arange(low, stop + 1, group)
        edges = grid.origin + grid.width * edges_at
        out: dict[str, list[float]] = {}
        for code, phase in enumerate(self.phases):
            if code >= flows.shape[0] or not flows[code, 0].any():
                continue
            # the integral over time of the spans in flight, at each cell's lower edge: the starts before it, each
            # (edge - start), less the ends before it, each (edge - end)
            counted = np.concatenate([[0.0], np.cumsum(flows[code, 0] - flows[code, 2])])
            summed = np.concatenate([[0.0], np.cumsum(flows[code, 1] - flows[code, 3])])
            if len(counted) <= stop:
                counted = np.concatenate([counted, np.full(stop + 1 - len(counted), counted[-1])])
                summed = np.concatenate([summed, np.full(stop + 1 - len(summed), summed[-1])])
            integral = counted[edges_at] * edges - summed[edges_at]
            out[phase] = (np.diff(integral) / (grid.width * group)).tolist()
        return edges.tolist(), out

    def slowest(self) -> list[Episode]:
        """The :data:`GANTT_SLOWEST` longest episodes, longest first (ties: in the order added)."""
        self._fold()
        return list(self._slowest)

    def first_to_start(self, limit: int | None = None) -> list[Episode]:
        """The first ``limit`` (at most :attr:`keep`) episodes to start, in order of their start."""
        self._fold()
        return self._earliest[:limit]

    def chosen(self, count: int = GANTT_EPISODES) -> list[Episode]:
        """The episodes the Gantt chart draws: the :meth:`slowest` and others spread over the run (the earliest
        to start in cells of equal time), in order of their start."""
        self._fold()
        picked = {e.order: e for e in self._slowest[:count]}
        spread = [e for e in self._cells if e is not None and e.order not in picked]
        room = count - len(picked)
        if room > 0 and spread:
            step = len(spread) / room
            at = 0.0
            while len(picked) < count and at < len(spread):
                picked[spread[int(at)].order] = spread[int(at)]
                at += step
        for episode in self._earliest:  # too few cells held one (episodes that start together): the first to start
            if len(picked) >= count:
                break
            picked.setdefault(episode.order, episode)
        return sorted(picked.values(), key=_by_start)


def _ordered_phases(names: Iterable[str]) -> list[str]:
    known = [p for p in (*PHASES, "other") if p in names]
    return known + sorted(set(names) - set(known))


# -- the page ----------------------------------------------------------------------------------------------


def _share_table(parts: dict[str, float], total: float, episodes: int) -> str:
    rows = []
    for phase in sorted(parts, key=lambda p: -parts[p]):
        seconds = parts[phase]
        swatch = f'<span class="swatch" style="background:{phase_color(phase)}"></span>'
        rows.append(f"<tr><td>{swatch}<code>{escape(phase)}</code></td><td>{seconds / total:.1%}</td>"
                    f"<td>{_fmt(seconds / max(1, episodes))} s</td><td>{_fmt(seconds)} s</td></tr>")
    return ('<table class="figures shares"><thead><tr><th>phase</th><th>share of episode time</th>'
            "<th>per episode</th><th>total</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _in_flight_chart(edges: list[float], series: dict[str, list[float]], width: int = WIDTH * 2,
                     height: int = HEIGHT) -> str:
    """Stacked areas: the mean number of spans of each phase in flight, interval by interval."""
    left, top = MARGIN["left"], MARGIN["top"]
    right, bottom = width - MARGIN["right"] - 110, height - MARGIN["bottom"]
    phases = _ordered_phases(series)
    bins = len(edges) - 1
    totals = [sum(series[p][i] for p in phases) for i in range(bins)]
    y_ticks = nice_ticks(0.0, max(max(totals, default=0.0), 1.0), 5)
    x_ticks = nice_ticks(edges[0], edges[-1], 8)
    y_top = y_ticks[-1]
    x_low, x_high = x_ticks[0], x_ticks[-1]

    def x(value: float) -> float:
        return left + (value - x_low) / ((x_high - x_low) or 1.0) * (right - left)

    def y(value: float) -> float:
        return bottom - value / (y_top or 1.0) * (bottom - top)

    title = "Spans in flight by phase (mean per interval)"
    out = [f'<svg class="chart wide" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
           f'<text class="chart-title" x="{left}" y="18">{escape(title)}</text>']
    for tick in y_ticks:
        out.append(f'<line class="grid" x1="{left}" x2="{right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
                   f'<text class="tick" x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{_fmt(tick)}</text>')
    for tick in x_ticks:
        out.append(f'<text class="tick" x="{x(tick):.1f}" y="{bottom + 16}" text-anchor="middle">{_fmt(tick)}</text>')
    mids = [(edges[i] + edges[i + 1]) / 2 for i in range(bins)]
    base = [0.0] * bins
    for phase in phases:
        upper = [b + v for b, v in zip(base, series[phase])]
        points = " ".join(f"{x(m):.1f},{y(u):.1f}" for m, u in zip(mids, upper))
        lower = " ".join(f"{x(m):.1f},{y(b):.1f}" for m, b in zip(reversed(mids), reversed(base)))
        peak = max(series[phase])
        out.append(f'<polygon class="area" points="{points} {lower}" fill="{phase_color(phase)}">'
                   f"<title>{escape(phase)}: up to {_fmt(peak)} in flight</title></polygon>")
        base = upper
    out.append(f'<line class="axis" x1="{left}" x2="{right}" y1="{bottom}" y2="{bottom}"/>')
    out.append(f'<text class="axis-label" x="{(left + right) / 2:.1f}" y="{height - 8}" text-anchor="middle">'
               "seconds since the start</text>")
    out.append(f'<text class="axis-label" transform="translate(14 {(top + bottom) / 2:.1f}) rotate(-90)" '
               'text-anchor="middle">spans in flight</text>')
    out.extend(_phase_legend(phases, right + 14, top))
    out.append("</svg>")
    return "\n".join(out)


def _phase_legend(phases: list[str], left: float, top: float) -> list[str]:
    out = [f'<g class="legend" transform="translate({left:.0f} {top:.0f})">']
    for i, phase in enumerate(phases):
        out.append(f'<rect x="0" y="{i * 17}" width="12" height="12" rx="2" fill="{phase_color(phase)}"/>'
                   f'<text x="18" y="{i * 17 + 10}">{escape(phase)}</text>')
    out.append("</g>")
    return out


def _gantt(chosen: list[Episode], slowest: set[int], width: int = WIDTH * 2) -> str:
    """One row per chosen episode: its extent, and each of its spans (a tooltip each); ``slowest``: the
    slowest episodes' places in the order added."""
    row_h, left, right, top = 16, 150, width - 124, MARGIN["top"]
    height = top + row_h * len(chosen) + 44
    low = min(e.began for e in chosen)
    high = max(e.ended for e in chosen)
    x_ticks = nice_ticks(low, max(high, low + 1e-3), 8)
    x_low, x_high = x_ticks[0], x_ticks[-1]

    def x(value: float) -> float:
        return left + (value - x_low) / ((x_high - x_low) or 1.0) * (right - left)

    title = f"Episodes' spans ({len(chosen)} episodes: the {len(slowest)} slowest and others across the run)"
    out = [f'<svg class="chart wide gantt" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
           f'<text class="chart-title" x="12" y="18">{escape(title)}</text>']
    bottom = top + row_h * len(chosen)
    for tick in x_ticks:
        out.append(f'<line class="grid grid-x" x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{top}" y2="{bottom}"/>'
                   f'<text class="tick" x="{x(tick):.1f}" y="{bottom + 16}" text-anchor="middle">{_fmt(tick)}</text>')
    seen: set[str] = set()
    for row, episode in enumerate(chosen):
        y = top + row * row_h
        began, ended, eid = episode.began, episode.ended, episode.id
        mark = " (slowest)" if episode.order in slowest else ""
        out.append(f'<g class="lane" data-episode="{escape(eid)}"><text class="lane-label" x="{left - 6}" '
                   f'y="{y + 11}" text-anchor="end">{escape(eid[:22])}</text>'
                   f'<rect class="extent" x="{x(began):.1f}" y="{y + 2}" width="{max(0.5, x(ended) - x(began)):.1f}" '
                   f'height="{row_h - 4}"><title>{escape(eid)}{mark}: {_fmt(ended - began)} s</title></rect>')
        for phase, a, b, name in episode.spans:
            seen.add(phase)
            label = f"{phase}" + (f" {name}" if name else "")
            out.append(f'<rect class="span" data-phase="{escape(phase)}" x="{x(a):.1f}" y="{y + 3}" '
                       f'width="{max(0.8, x(b) - x(a)):.1f}" height="{row_h - 6}" fill="{phase_color(phase)}">'
                       f"<title>{escape(eid)}: {escape(label)} {_fmt(b - a)} s (from {_fmt(a)} s)</title></rect>")
        out.append("</g>")
    out.append(f'<text class="axis-label" x="{(left + right) / 2:.1f}" y="{height - 8}" text-anchor="middle">'
               "seconds since the start</text>")
    out.extend(_phase_legend(_ordered_phases(seen), right + 14, top))
    out.append("</svg>")
    return "\n".join(out)


def timeline_section(timeline: Timeline | None, metrics: dict[str, Any] | None, trace: str | None = None) -> str:
    """The report's "Time" section ('' when no episode recorded spans)."""
    if timeline is None or not len(timeline):
        return ""
    recorded = (metrics or {}).get("time_shares")
    total_s = (metrics or {}).get("episode_time_s")
    if isinstance(recorded, dict) and recorded and isinstance(total_s, (int, float)) and total_s > 0:
        parts, total = {p: float(v) * total_s for p, v in recorded.items()}, float(total_s)  # the run's own sums
    else:
        parts, total = timeline.shares()
    if total <= 0:
        return ""
    chosen = timeline.chosen()
    slowest = {e.order for e in timeline.slowest()} & {e.order for e in chosen}
    n = len(timeline)
    edges, series = timeline.in_flight()
    charts = [_in_flight_chart(edges, series)] if series else []
    charts.append(_gantt(chosen, slowest))
    note = (f"{n:,} episodes recorded spans, {_fmt(total)} s of episode time in all. At each instant an episode's "
            "time goes to one phase (the first of " + ", ".join(PHASES) + " that is active), "
            "<code>other</code> when no span covers it (the controller's own code, or the event loop busy with other "
            "episodes: building prompts, recording finished episodes), so the shares sum to 100%. "
            "Times are seconds since the session's start.")
    if trace:
        note += (f" The spans are also in <code>{escape(trace)}</code> (Chrome's trace format): open it in "
                 "Perfetto (ui.perfetto.dev) or chrome://tracing.")
    if isinstance(recorded, dict) and recorded:
        note += " metrics.json holds the same shares (<code>time_shares</code>)."
    return (f'<section id="time"><h2>Time</h2><p class="note">{note}</p>{_share_table(parts, total, n)}'
            f'<div class="charts wide">{"".join(charts)}</div></section>')


# -- Chrome's trace format ---------------------------------------------------------------------------------


def trace_json(timeline: Timeline, limit: int = TRACE_EPISODES) -> str:
    """The spans of the first ``limit`` episodes to start (at most the timeline's ``keep``), as a Chrome trace:
    complete events (``"ph": "X"``) in whole microseconds (spans are recorded to 0.1 ms), an episode's slice and
    its spans' on the first row free when it starts (rows are slots of concurrency), each with the episode's id
    in its args. Written as text directly: a run's trace has some hundred thousand events."""
    import orjson

    order = timeline.first_to_start(limit)
    free: list[tuple[float, int]] = []  # (when the row frees, row)
    rows = 0
    quoted: dict[str, str] = {}

    def text(value: str) -> str:
        found = quoted.get(value)
        if found is None:
            found = quoted[value] = orjson.dumps(value).decode()
        return found

    events = ['{"name":"process_name","ph":"M","pid":1,"args":{"name":"episodes"}}']
    for episode in order:
        a, b = episode.began, episode.ended
        if free and free[0][0] <= a:
            _, row = heapq.heappop(free)
        else:
            row = rows
            rows += 1
            events.append(f'{{"name":"thread_name","ph":"M","pid":1,"tid":{row},"args":{{"name":"slot {row}"}}}}')
        heapq.heappush(free, (b, row))
        eid = orjson.dumps(episode.id).decode()
        args = f'"args":{{"episode_id":{eid}}}}}'
        events.append(f'{{"name":{eid},"cat":"episode","ph":"X","pid":1,"tid":{row},"ts":{round(a * 1e6)},'
                      f'"dur":{round(b * 1e6) - round(a * 1e6) if b > a else 0},{args}')
        for phase, start, end, name in episode.spans:
            events.append(f'{{"name":{text(name or phase)},"cat":{text(phase)},"ph":"X","pid":1,'
                          f'"tid":{row},"ts":{round(start * 1e6)},"dur":{round(max(0.0, end - start) * 1e6)},'
                          f"{args}")
    other = orjson.dumps({"episodes": len(order), "of": len(timeline)}).decode()
    return '{"traceEvents":[' + ",\n".join(events) + f'],"displayTimeUnit":"ms","otherData":{other}}}'


def trace_events(timeline: Timeline, limit: int = TRACE_EPISODES) -> dict[str, Any]:
    """:func:`trace_json`, read back."""
    import orjson

    data: dict[str, Any] = orjson.loads(trace_json(timeline, limit))
    return data


def write_trace(timeline: Timeline, path: Path, *, private: bool = True, limit: int = TRACE_EPISODES) -> Path:
    """Write :func:`trace_json` to ``path`` (atomically)."""
    from scaffold_core.output.files import atomic_write_text

    atomic_write_text(path, trace_json(timeline, limit), private=private)
    return path
