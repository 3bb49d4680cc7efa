"""How many threads the engine's CPU work runs on: every core while nothing else wants one, one fewer otherwise.

torch's CPU products run on OpenMP threads that spin while they wait for each other. With a thread on every
core, any other busy thread (the event loop, a verifier, a neighbour) stalls the whole team: a decode step
that took ~95 ms on one thread took ~1,100 ms on two of a 2-core machine under a load of 2.3. One core fewer
never stalls, but on an idle machine it leaves a core unused, and a decode step reads its weights faster on
two threads than on one (``bench/engine_speed.py``).

:class:`CoreShare` therefore looks, at most every :data:`INTERVAL_S`, at how much CPU time went to anything
other than the engine since it last looked: other processes (Linux's ``/proc/stat`` less this process's
time) and this process's other Python threads. More than :data:`BUSY_CORES` of a core, and the engine runs
on one core fewer at once; under :data:`IDLE_CORES` twice in a row (once, the first time), and it takes
every core again. Only the engine's busy time is looked at: when it has nothing to do (:meth:`rest`), or its
last look is older than :data:`STALE_S`, the next look starts afresh, and the thread count stays as it was
until then. Where ``/proc`` is missing (not Linux) it keeps one core fewer.

Every :data:`PROBE_EVERY` th decode step on every core runs on one core fewer and is timed: where that is as
fast (a process whose other threads run OpenMP teams of their own: libgomp then makes waiting threads sleep
at once, and two threads can be slower than one), the engine keeps one core fewer for :data:`RETRY_S`.

The thread count changes no result: the products (fbgemm's float16 kernel) and the lean forward's other
operations give the same bits on any number of threads (attention with few queries is written out for that:
``lean_llama.attention``), so a seeded run samples the same tokens and logprobs whatever the load.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

#: Seconds between two looks at the machine.
INTERVAL_S = 0.25
#: Every this many decode steps on every core, one runs on a core fewer, timed against the step before it ...
PROBE_EVERY = 16
#: ... and where two such steps in a row were as fast (within this share), the engine keeps a core fewer ...
PROBE_MARGIN = 1.05
#: ... for this many seconds before trying every core again.
RETRY_S = 30.0
#: Seconds after which the last look is forgotten (the engine was idle) and a new one starts.
STALE_S = 4 * INTERVAL_S
#: Cores' worth of CPU time used by others above which the engine leaves them a core.
BUSY_CORES = 0.25
#: ... and below which (twice in a row) it takes every core again.
IDLE_CORES = 0.1
#: Clock ticks a second, the unit of /proc's CPU times.
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy_s() -> float:
    """CPU seconds all cores spent on work since boot (``/proc/stat``: not idle, not waiting, not stolen)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    return (user + nice + system + irq + softirq) / _TICKS


def _thread_s(native_id: int) -> float | None:
    """CPU seconds a thread of this process has used (None when it is gone: a thread that has ended may still be
    listed by :func:`threading.enumerate` for a moment)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", encoding="ascii") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


class CoreShare:
    """The thread count of one engine's worker thread, set before each forward pass (:meth:`adjust`)."""

    def __init__(self, torch: Any, cores: int, *, clock: Any = time.monotonic,
                 others_s: Any = None) -> None:
        self.torch = torch
        self.most, self.least = cores, self.least_of(cores)
        self.threads = self.least
        self.changes = 0  # times the count changed
        self._clock = clock
        self._others_s = others_s or self._measure_others_s
        self._last: tuple[float, float] | None = None  # (clock, others' CPU seconds) when last looked
        self._calm = 0  # looks in a row that found the machine idle
        self._first = False  # the last look is the one start() took
        self._threads: dict[int, float] = {}  # this process's other Python threads: CPU seconds at the last look
        self._inside = 0.0  # CPU seconds they used, summed over the looks
        self.works = os.path.exists("/proc/stat") or others_s is not None
        self._steps = 0  # decode steps on every core
        self._probing = False  # this decode step runs on a core fewer, to be timed
        self._every_core_s: dict[int, float] = {}  # rows -> seconds of the last decode step on every core
        self._as_fast = 0  # probes in a row that found a core fewer as fast
        self._every_core_after = 0.0  # clock before which every core is not tried again

    @staticmethod
    def least_of(cores: int) -> int:
        """The thread count an engine starts on, and the least it takes: one core fewer than it may use."""
        return max(1, cores - 1)

    def start(self) -> None:
        """Set the least thread count and take the first look (called when the engine has loaded its model: the
        first :meth:`adjust` judges by the load's time, however long it took)."""
        self.torch.set_num_threads(self.threads)
        if self.works:
            self._last = (self._clock(), self._others_s())
            self._first = True

    def adjust(self, lean: bool = True) -> int:
        """Set the thread count for the next forward pass (``lean``: the lean forward's; any other keeps the
        least, since transformers' forward may not give the same bits on another thread count)."""
        if not lean:
            return self._set(self.least)
        if not self.works:
            return self.threads
        now = self._clock()
        if self._last is None:  # the engine was resting: a new look starts
            self._last = (now, self._others_s())
            return self.threads
        span = now - self._last[0]
        if span < INTERVAL_S:
            return self.threads
        others = self._others_s()
        if span > STALE_S and not self._first:  # too old to say what happens now: a new look starts
            self._last = (now, others)
            return self.threads
        self._first = False
        busy = (others - self._last[1]) / span  # cores' worth used by others
        self._last = (now, others)
        if busy > BUSY_CORES:
            self._calm = 0
            return self._set(self.least)
        if busy < IDLE_CORES:
            self._calm += 1
            if (self._calm >= 2 or self.changes == 0) and now >= self._every_core_after:  # first time: one look
                return self._set(self.most)
        return self.threads

    def step_threads(self) -> int:
        """:meth:`adjust` for a decode step; every :data:`PROBE_EVERY` th step on every core runs on a core fewer,
        which :meth:`timed` compares with the step before it. Every core is faster on an idle machine, but not
        where libgomp makes waiting threads sleep at once: in a process whose other threads run OpenMP teams of
        their own (another library's, another engine's), more threads than cores."""
        threads = self.adjust()
        if threads != self.most or self.most == self.least:
            return threads
        self._steps += 1
        if self._steps % PROBE_EVERY:
            return threads
        self._probing = True
        self.torch.set_num_threads(self.least)
        return self.least

    def timed(self, rows: int, seconds: float) -> None:
        """A decode step of ``rows`` rows, set by :meth:`step_threads`, took ``seconds``."""
        if not self._probing:
            if self.threads == self.most:
                self._every_core_s[rows] = seconds
            return
        self._probing = False
        self.torch.set_num_threads(self.threads)
        every_core = self._every_core_s.get(rows)
        if every_core is None:
            return
        self._as_fast = self._as_fast + 1 if seconds <= every_core * PROBE_MARGIN else 0
        if self._as_fast >= 2:  # every core is no faster here: a core fewer, for a while
            self._as_fast = 0
            self._every_core_s.clear()
            self._every_core_after = self._clock() + RETRY_S
            self._set(self.least)

    def rest(self) -> None:
        """The engine has nothing to do: the next look starts when it works again (what others do while it
        waits does not say what they will do while it works; a busy gap would cost the next batch a core)."""
        self._last = None

    def _set(self, threads: int) -> int:
        if threads != self.threads:
            self.torch.set_num_threads(threads)
            self.threads = threads
            self.changes += 1
        return threads

    def _measure_others_s(self) -> float:
        """CPU seconds used so far by everything but this engine's worker thread and its OpenMP team: the
        machine's busy time, less this process's, plus what this process's Python threads other than the caller
        used since the last look (a thread that ended since is left out: its lifetime would count as negative)."""
        me = threading.get_native_id()
        threads = {}
        for t in threading.enumerate():
            if t.native_id is not None and t.native_id != me and (used := _thread_s(t.native_id)) is not None:
                threads[t.native_id] = used
                # never negative: a new thread reusing an ended one's id starts below it
                self._inside += max(0.0, used - self._threads.get(t.native_id, 0.0))
        self._threads = threads
        # read side by side: what this process uses between the two reads would count as others' otherwise
        machine = _machine_busy_s()
        process = os.times()
        return machine - (process.user + process.system) + self._inside
