"""Bounded waits that share one timer per timeout length, instead of a timer per wait.

``asyncio.timeout(seconds)`` schedules (and cancels) a timer in the event
loop's heap for every wait; with thousands of engine requests a second that
is a fifth of a majority-vote run's overhead. The runtime's waits come in a
few fixed lengths (``request_timeout``, ``episode_timeout``), so the waits of
one length expire in the order they began: :class:`Deadlines` keeps them in a
queue per length and one timer at the earliest deadline still waiting.

A wait ends exactly as under ``asyncio.timeout``: when its deadline passes,
its task is cancelled, and the ``CancelledError`` becomes ``TimeoutError``
unless the task was also cancelled by someone else; the timer fires on the
loop iteration ``asyncio.timeout``'s own timer would.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

_WAITING, _EXPIRING, _EXPIRED, _DONE = range(4)


class _Wait:
    __slots__ = ("deadline", "task", "state", "cancelling")

    def __init__(self, deadline: float, task: Any, cancelling: int):
        self.deadline = deadline
        self.task = task
        self.state = _WAITING
        self.cancelling = cancelling


class _Queue:
    """The waits of one length, in the order they began (so in deadline order), and one timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float):
        self.loop = loop
        self.seconds = seconds
        self.waits: deque[_Wait] = deque()
        self.waiting = 0
        self.timer: asyncio.TimerHandle | None = None

    def add(self, task: Any) -> _Wait:
        wait = _Wait(self.loop.time() + self.seconds, task, task.cancelling())
        self.waits.append(wait)
        self.waiting += 1
        if self.timer is None:
            self.timer = self.loop.call_at(wait.deadline, self.expire)
        return wait

    def done(self, wait: _Wait) -> None:
        if wait.state == _WAITING:
            self.waiting -= 1
        wait.state = _DONE
        waits = self.waits
        while waits and waits[0].state >= _EXPIRED:
            waits.popleft()
        if len(waits) > 2 * self.waiting + 64:  # finished waits behind a long one: drop them
            self.waits = deque(w for w in waits if w.state < _EXPIRED)
        # The timer stays even when nothing waits: it fires once at its deadline and finds nothing, which
        # is cheaper than cancelling and scheduling a timer for every short wait.

    def expire(self) -> None:
        """Expire every wait whose deadline has come (as the loop's timers run: up to its clock resolution)."""
        self.timer = None
        waits = self.waits
        end = self.loop.time() + self.loop._clock_resolution  # type: ignore[attr-defined]
        while waits:
            wait = waits[0]
            if wait.state == _WAITING:
                if wait.deadline >= end:
                    self.timer = self.loop.call_at(wait.deadline, self.expire)
                    return
                wait.state = _EXPIRING
                self.waiting -= 1
                wait.task.cancel()
            waits.popleft()


class Deadlines:
    """``await deadlines.bounded(awaitable, seconds)``: like ``asyncio.timeout(seconds)`` around the await."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[float, _Queue] = {}

    def _queue(self, seconds: float) -> _Queue:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop: the old one's timers are gone with it
            self._loop = loop
            self._queues = {}
        queue = self._queues.get(seconds)
        if queue is None:
            queue = self._queues[seconds] = _Queue(loop, seconds)
        return queue

    if sys.version_info >= (3, 11):

        async def bounded(self, awaitable: Awaitable[T], seconds: float | None) -> T:
            if seconds is None:
                return await awaitable
            task = asyncio.current_task()
            if task is None:
                raise RuntimeError("a bounded wait must run inside a task")
            queue = self._queue(seconds)
            wait = queue.add(task)
            try:
                return await awaitable
            except asyncio.CancelledError as exc:
                if wait.state == _EXPIRING:
                    wait.state = _EXPIRED
                    if task.uncancel() <= wait.cancelling:
                        raise TimeoutError from exc
                raise
            finally:
                if wait.state == _EXPIRING:  # expired as it finished: take back the cancel request, as asyncio does
                    wait.state = _EXPIRED
                    task.uncancel()
                queue.done(wait)

    else:  # pragma: no cover - Python 3.10 has no Task.uncancel: a timer per wait

        async def bounded(self, awaitable: Awaitable[T], seconds: float | None) -> T:
            return await asyncio.wait_for(awaitable, seconds)
