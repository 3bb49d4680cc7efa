"""Where the time went: every episode's spans, as the report's timeline and a Chrome trace.

:class:`Timeline` keeps every span of every episode in a few arrays while the
report scans the heads (about 20 bytes a span: a run of 200,000 episodes
keeps a few million spans in some tens of megabytes). From them:

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
from array import array
from collections.abc import Iterable
from html import escape
from pathlib import Path
from typing import Any

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


def phase_color(phase: str) -> str:
    return PHASE_COLORS.get(phase, PALETTE[6])


class Timeline:
    """Every span of every episode that recorded them, in arrays (see the module's docstring)."""

    def __init__(self) -> None:
        self.phases: list[str] = []  # the phase of each code
        self._codes: dict[str, int] = {}
        self.names: list[str] = []  # the names spans carry (a tool's), by code; 0: none
        self._name_codes: dict[str, int] = {"": 0}
        self.names.append("")
        self.kind = array("h")  # per span: its phase's code
        self.name = array("i")  # per span: its name's code
        self.start = array("d")
        self.end = array("d")
        self.first = array("q")  # per episode: its first span's place in the span arrays
        self.position = array("q")  # per episode: its position in the browser's order
        self.began = array("d")  # per episode: its start (its first span's, when that is earlier)
        self.ended = array("d")
        self.ids: list[str] = []

    def __len__(self) -> int:
        return len(self.first)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timeline):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in (
            "phases", "names", "kind", "name", "start", "end", "first", "position", "began", "ended", "ids"))

    def add(self, position: int, head: dict[str, Any]) -> None:
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
        self.position.append(position)
        self.began.append(began)
        self.ended.append(ended)
        episode_id = head.get("episode_id", "")
        self.ids.append(episode_id if type(episode_id) is str else str(episode_id))

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

    def spans_of(self, episode: int) -> list[tuple[str, float, float, str]]:
        """(phase, start, end, name) of the ``episode``-th episode added."""
        stop = self.first[episode + 1] if episode + 1 < len(self.first) else len(self.kind)
        return [(self.phases[self.kind[i]], self.start[i], self.end[i], self.names[self.name[i]])
                for i in range(self.first[episode], stop)]

    def shares(self) -> tuple[dict[str, float], float]:
        """({phase: seconds}, total seconds) of the episodes' time, divided as ``metrics.json``'s ``time_shares``
        (:func:`scaffold_core.spans.exclusive`)."""
        parts: dict[str, float] = {}
        total = 0.0
        for episode in range(len(self)):
            begin, end = self.began[episode], self.ended[episode]
            if end <= begin:
                continue
            total += end - begin
            for phase, seconds in exclusive(self.spans_of(episode), begin, end).items():
                parts[phase] = parts.get(phase, 0.0) + seconds
        return parts, total

    def in_flight(self, bins: int = BINS) -> tuple[list[float], dict[str, list[float]]]:
        """(interval edges, {phase: mean number of its spans in flight in each interval}) over the run."""
        import numpy as np

        if not len(self.kind):
            return [], {}
        start = np.frombuffer(self.start, dtype=np.float64)
        end = np.frombuffer(self.end, dtype=np.float64)
        kind = np.frombuffer(self.kind, dtype=np.int16)
        low, high = float(start.min()), float(end.max())
        if high <= low:
            high = low + 1e-3
        edges = np.linspace(low, high, bins + 1)
        width = edges[1] - edges[0]
        out: dict[str, list[float]] = {}
        for code, phase in enumerate(self.phases):
            mask = kind == code
            if not mask.any():
                continue
            # the integral over [low, t] of the spans in flight: sum of clip(t - s, 0, e - s), by sorted sums
            s, e = np.sort(start[mask]), np.sort(end[mask])
            cs, ce = np.concatenate(([0.0], np.cumsum(s))), np.concatenate(([0.0], np.cumsum(e)))
            ns, ne = np.searchsorted(s, edges, "right"), np.searchsorted(e, edges, "right")
            integral = (ns * edges - cs[ns]) - (ne * edges - ce[ne])
            out[phase] = (np.diff(integral) / width).tolist()
        return edges.tolist(), out

    def by_start(self) -> list[int]:
        """Every episode, in order of its start (ties: in the order added)."""
        import numpy as np

        return np.argsort(np.frombuffer(self.began, dtype=np.float64), kind="stable").tolist()

    def slowest(self, count: int = GANTT_SLOWEST) -> list[int]:
        """The ``count`` longest episodes, longest first (ties: in the order added)."""
        import numpy as np

        took = np.frombuffer(self.ended, dtype=np.float64) - np.frombuffer(self.began, dtype=np.float64)
        return np.argsort(-took, kind="stable")[:count].tolist()

    def chosen(self, count: int = GANTT_EPISODES, longest: Iterable[int] | None = None) -> list[int]:
        """The episodes the Gantt chart draws: the ``longest`` (default: the :meth:`slowest`) and others spread
        evenly over the run, in order of their start."""
        n = len(self)
        by_start = self.by_start()
        if n <= count:
            return by_start
        picked = set(self.slowest() if longest is None else longest)
        step = n / max(1, count - len(picked))
        at = 0.0
        while len(picked) < count and at < n:
            picked.add(by_start[int(at)])
            at += step
        for episode in by_start:  # spread picks that met a slowest one: the next to start instead
            if len(picked) >= count:
                break
            picked.add(episode)
        return sorted(picked, key=self.began.__getitem__)


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


def _gantt(timeline: Timeline, chosen: list[int], slowest: set[int], width: int = WIDTH * 2) -> str:
    """One row per chosen episode: its extent, and each of its spans (a tooltip each)."""
    row_h, left, right, top = 16, 150, width - 124, MARGIN["top"]
    height = top + row_h * len(chosen) + 44
    low = min(timeline.began[i] for i in chosen)
    high = max(timeline.ended[i] for i in chosen)
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
        began, ended = timeline.began[episode], timeline.ended[episode]
        eid = timeline.ids[episode]
        mark = " (slowest)" if episode in slowest else ""
        out.append(f'<g class="lane" data-episode="{escape(eid)}"><text class="lane-label" x="{left - 6}" '
                   f'y="{y + 11}" text-anchor="end">{escape(eid[:22])}</text>'
                   f'<rect class="extent" x="{x(began):.1f}" y="{y + 2}" width="{max(0.5, x(ended) - x(began)):.1f}" '
                   f'height="{row_h - 4}"><title>{escape(eid)}{mark}: {_fmt(ended - began)} s</title></rect>')
        for phase, a, b, name in timeline.spans_of(episode):
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
    slowest = set(timeline.slowest())
    chosen = timeline.chosen(longest=slowest)
    n = len(timeline)
    edges, series = timeline.in_flight()
    charts = [_in_flight_chart(edges, series)] if series else []
    charts.append(_gantt(timeline, chosen, slowest & set(chosen)))
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
    """The spans of the first ``limit`` episodes to start, as a Chrome trace: complete events (``"ph": "X"``) in
    whole microseconds (spans are recorded to 0.1 ms), an episode's slice and its spans' on the first row free
    when it starts (rows are slots of concurrency), each with the episode's id in its args. Written as text
    directly: a run's trace has some hundred thousand events."""
    import orjson

    n = len(timeline)
    began, ended, first = timeline.began, timeline.ended, timeline.first
    order = timeline.by_start()[:limit]
    free: list[tuple[float, int]] = []  # (when the row frees, row)
    rows = 0
    phases = [orjson.dumps(p).decode() for p in timeline.phases]
    names = [orjson.dumps(name).decode() for name in timeline.names]
    kind, label, start, end = timeline.kind, timeline.name, timeline.start, timeline.end
    total = len(kind)
    events = ['{"name":"process_name","ph":"M","pid":1,"args":{"name":"episodes"}}']
    for episode in order:
        a, b = began[episode], ended[episode]
        if free and free[0][0] <= a:
            _, row = heapq.heappop(free)
        else:
            row = rows
            rows += 1
            events.append(f'{{"name":"thread_name","ph":"M","pid":1,"tid":{row},"args":{{"name":"slot {row}"}}}}')
        heapq.heappush(free, (b, row))
        eid = orjson.dumps(timeline.ids[episode]).decode()
        args = f'"args":{{"episode_id":{eid}}}}}'
        events.append(f'{{"name":{eid},"cat":"episode","ph":"X","pid":1,"tid":{row},"ts":{round(a * 1e6)},'
                      f'"dur":{round(b * 1e6) - round(a * 1e6) if b > a else 0},{args}')
        stop = first[episode + 1] if episode + 1 < n else total
        for i in range(first[episode], stop):
            phase = phases[kind[i]]
            events.append(f'{{"name":{names[label[i]] if label[i] else phase},"cat":{phase},"ph":"X","pid":1,'
                          f'"tid":{row},"ts":{round(start[i] * 1e6)},"dur":{round(max(0.0, end[i] - start[i]) * 1e6)},'
                          f"{args}")
    other = orjson.dumps({"episodes": len(order), "of": n}).decode()
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
