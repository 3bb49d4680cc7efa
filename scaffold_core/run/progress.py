"""Live progress of a run: a tqdm bar on a terminal, plain periodic lines when the output is a file or a pipe.

On a terminal the bar counts episodes (``scaffold eval``: answers) with its
ETA, and its status shows samples, generated tokens, tokens/s, the mean
reward and failures. The status is refreshed every second even while no
episode finishes, from the engine's live count of decoded tokens when it
keeps one (``decoded_tokens``, an optional engine attribute), so a long batch
is seen decoding. When stderr is not a terminal (``make run``, a job log, a
pipe), one line is printed every :data:`PLAIN_INTERVAL_S` seconds instead, and
one at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

#: Seconds between the plain progress lines written when the output is not a terminal.
PLAIN_INTERVAL_S = 15.0
#: Seconds between refreshes of the bar's status on a terminal.
BAR_INTERVAL_S = 1.0


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def clock_text(seconds: float | None) -> str:
    """``1:02:03``, ``2:03`` or ``?``."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Progress of ``total`` units (episodes, or answers; None: not known): ``enabled`` True (a bar), False
    (nothing) or None (a bar on a terminal, else plain lines every ``interval`` seconds)."""

    def __init__(self, total: int | None, *, enabled: bool | None, unit: str = "ep", desc: str = "episodes",
                 position: int | None = None, stream: TextIO | None = None, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic, status: Callable[[], str] | None = None):
        """``status``: called for the status text when the progress is drawn (at most once per ``interval``)."""
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.done, self.desc = total, 0, desc
        self.clock = clock
        self.started = self.last_line = clock()
        self.status = ""
        self.status_fn = status
        self.bar: Any = None
        if enabled is False:
            self.mode = "off"
        elif enabled or _isatty(self.stream):
            from tqdm import tqdm

            self.mode = "bar"
            self.bar = tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True, mininterval=0.5, position=position,
                            leave=True, file=self.stream)
        else:
            self.mode = "lines"
        self.interval = interval if interval is not None else (BAR_INTERVAL_S if self.mode == "bar"
                                                               else PLAIN_INTERVAL_S)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def restart(self) -> None:
        """Start the clock now (after the model loaded)."""
        self.started = self.last_line = self.clock()
        if self.bar is not None:
            self.bar.reset(total=self.total)

    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (None before the first unit is done)."""
        if not self.done or self.total is None:
            return None
        return (self.clock() - self.started) / self.done * max(self.total - self.done, 0)

    def advance(self, units: int, status: str = "") -> None:
        """``units`` more are done; ``status``: the samples, tokens, reward... text."""
        self.done += units
        if status:
            self.status = status
        if self.bar is not None:
            self.bar.update(units)
        self.tick()

    def update(self, status: str) -> None:
        """A new status (e.g. tokens decoded while no episode finished)."""
        self.status = status
        self.tick()

    def tick(self, force: bool = False) -> None:
        """Redraw the bar, or print a plain line, when ``interval`` seconds passed since the last time."""
        if self.mode == "off":
            return
        now = self.clock()
        if not force and now - self.last_line < self.interval:
            return
        self.last_line = now
        if self.status_fn is not None:
            self.status = self.status_fn()
        if self.bar is not None:
            self.bar.set_postfix_str(self.status, refresh=False)
            self.bar.refresh()
        else:
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def line(self) -> str:
        """``scaffold: episodes 12/40 (30%)  <status>  elapsed 0:42  eta 1:38``"""
        share = f"/{self.total:,} ({self.done / self.total:.0%})" if self.total else ""
        elapsed = self.clock() - self.started
        parts = [f"scaffold: {self.desc} {self.done:,}{share}", self.status,
                 f"elapsed {clock_text(elapsed)}", f"eta {clock_text(self.eta_s())}"]
        return "  ".join(p for p in parts if p)

    def close(self) -> None:
        if self.bar is not None:
            if self.status_fn is not None:
                self.status = self.status_fn()
            self.bar.set_postfix_str(self.status, refresh=False)
            self.bar.close()
        elif self.mode == "lines" and self.done:
            self.tick(force=True)


def run_status(metrics: Any, tokens: int, elapsed: float) -> str:
    """``samples 96  tokens 12,288  412.3 tok/s  reward 0.427  failed 0`` from a run's live metrics."""
    rate = tokens / elapsed if elapsed > 0 else 0.0
    parts = [f"samples {metrics.samples:,}", f"tokens {tokens:,}", f"{rate:,.1f} tok/s"]
    if metrics.scored_rollouts:
        parts.append(f"reward {metrics.reward_mean:.3f}")
    parts.append(f"failed {metrics.failed:,}")
    return "  ".join(parts)
