"""Where an episode's time went: spans (a phase, a start, an end) recorded as the episode runs.

The runtime opens a span list for each episode (:func:`recording`) and
records its waits in it: each engine request (``generate``, or the
``queued``/``prefill``/``decode`` parts an engine reports), each
verification (``verify``), each awaited call (``tool`` for a tool call, else
``await``, named by the call), and each wait for a weight update
(``weight_wait``). A span is a tuple ``(phase, start, end)`` or ``(phase,
start, end, name)``; times are seconds on :func:`clock` (the process's
monotonic clock) while the episode runs, and seconds since the session's
start once the episode is recorded (``EpisodeResult.spans``, the ``spans``
of its record in the store).

Plugins add spans of their own in two ways:

* code running inside an episode (a controller, an engine's ``generate``
  coroutine, an environment) calls :func:`add_span` or uses :func:`span`;
  outside an episode, or with spans turned off (``output.spans: false``),
  both do nothing;
* an engine whose work runs elsewhere (a batching thread) puts its spans in
  ``GenerationResult.meta["spans"]``: a list of ``(phase, start, end)`` on
  :func:`clock`; the runtime records them instead of one ``generate`` span.

Recording costs a list per episode and a tuple per span.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Iterator
from typing import Any

#: The phases the runtime and the built-in engines record, in order of precedence (see :func:`exclusive`).
PHASES = ("weight_wait", "queued", "prefill", "decode", "generate", "tool", "verify", "await")
#: The key of ``GenerationResult.meta`` an engine reports a request's spans under.
META_KEY = "spans"

#: The monotonic clock spans are measured on.
clock = time.perf_counter

#: The running episode's span list (None outside an episode); :func:`recording` sets it.
CURRENT: contextvars.ContextVar[list[tuple[Any, ...]] | None] = contextvars.ContextVar("scaffold_spans",
                                                                                     default=None)
_current = CURRENT


def current() -> list[tuple[Any, ...]] | None:
    """The span list of the episode running in this task, or None (outside an episode, or spans off)."""
    return _current.get()


def add_span(phase: str, start: float, end: float, name: str | None = None) -> None:
    """Record a span of the episode running in this task (``start``/``end`` on :func:`clock`); a no-op
    outside an episode."""
    spans = _current.get()
    if spans is not None:
        spans.append((phase, start, end) if name is None else (phase, start, end, name))


@contextlib.contextmanager
def span(phase: str, name: str | None = None) -> Iterator[None]:
    """Record the time the ``with`` block takes as a span of the running episode."""
    spans = _current.get()
    if spans is None:
        yield
        return
    start = clock()
    try:
        yield
    finally:
        end = clock()
        spans.append((phase, start, end) if name is None else (phase, start, end, name))


@contextlib.contextmanager
def recording(spans: list[tuple[Any, ...]] | None) -> Iterator[None]:
    """Make ``spans`` the running episode's span list for the block (and the tasks it starts); None: none."""
    token = _current.set(spans)
    try:
        yield
    finally:
        _current.reset(token)


def relative(spans: list[tuple[Any, ...]], zero: float, digits: int = 4) -> list[list[Any]]:
    """``spans`` as seconds since ``zero``, rounded to ``digits`` decimals (what a record holds), in order of
    their start. A span whose times are not finite numbers is left out, so a record's spans are always finite."""
    scale = 10.0 ** digits
    out: list[list[Any]] = []
    last = -math.inf
    ordered = True
    try:
        for item in spans:
            # round() of a float to an integer is fast; with ndigits it formats the number in decimal. It raises
            # on NaN and infinities, and on a time that is no number: those spans are left out (_finite).
            start, end = round((item[1] - zero) * scale) / scale, round((item[2] - zero) * scale) / scale
            if end < start:
                end = start
            if start < last:
                ordered = False
            last = start
            if len(item) > 3 and item[3] is not None:
                out.append([item[0], start, end, str(item[3])])
            else:
                out.append([item[0], start, end])
    except (TypeError, ValueError, OverflowError, IndexError):
        return relative(list(_finite(spans, zero, scale)), zero, digits)
    if not ordered:
        out.sort(key=_start)
    return out


def _finite(spans: list[Any], zero: float, scale: float) -> Iterator[tuple[Any, ...]]:
    """The spans of ``spans`` that are (phase, start, end[, name]) whose times, as :func:`relative` scales them, are
    finite; the times as floats."""
    for item in spans:
        try:
            a, b = float(item[1]), float(item[2])
        except (TypeError, ValueError, IndexError):
            continue
        if math.isfinite((a - zero) * scale) and math.isfinite((b - zero) * scale):
            yield (item[0], a, b, *item[3:4])


def _start(item: Any) -> float:
    return item[1]


def exclusive(spans: list[Any], start: float, end: float, order: tuple[str, ...] = PHASES) -> dict[str, float]:
    """How the time from ``start`` to ``end`` divides among the phases of ``spans`` (clipped to it): at each
    instant the first active phase in ``order`` takes it (phases not in ``order`` after them, by name), and
    ``other`` what no span covers. The parts sum to ``end - start``."""
    parts: dict[str, float] = {}
    last = start
    for item in spans:  # the usual case: one span after another, none overlapping (no precedence to decide)
        a, b = item[1], item[2]
        if a < last:
            break
        if b > end:
            b = end
        if b > a:
            phase = item[0]
            parts[phase] = parts.get(phase, 0.0) + (b - a)
            last = b
    else:
        covered = sum(parts.values())
        if end - start > covered:
            parts["other"] = parts.get("other", 0.0) + (end - start - covered)
        return parts
    rank = {phase: i for i, phase in enumerate(order)}
    edges = []
    for item in spans:
        a, b = max(float(item[1]), start), min(float(item[2]), end)
        if b > a:
            edges.append((a, 1, item[0]))
            edges.append((b, -1, item[0]))
    edges.sort(key=lambda e: e[0])
    parts = {}
    active: dict[str, int] = {}
    last = start
    for at, step, phase in edges:
        if at > last:
            top = min(active, key=lambda p: (rank.get(p, len(rank)), p)) if active else "other"
            parts[top] = parts.get(top, 0.0) + at - last
            last = at
        count = active.get(phase, 0) + step
        if count:
            active[phase] = count
        else:
            active.pop(phase, None)
    if end > last:
        parts["other"] = parts.get("other", 0.0) + end - last
    return parts
