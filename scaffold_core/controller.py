"""Controllers: plain-Python generators that decide what to generate and verify.

``Controller.process(ctx)`` is a synchronous generator. Each ``yield`` hands
the runtime one of:

* a ``list`` of tasks (:class:`GenerationTask`, :class:`VerificationTask`):
  all run concurrently; the generator resumes when every one has finished,
  with results written into the task objects (``yield`` also returns the
  list);
* a :class:`Parallel` set of branches: each branch is a sub-controller (its
  own clone) processing its own context; they run concurrently and ``yield``
  returns the list of their :class:`Outcome` values, in order.

The generator returns an :class:`Outcome` naming the episode's samples. Any
control flow in between is ordinary Python, so data-dependent loops (sample
until the answers agree, retry on a wrong answer) need no framework support.

The runtime calls :meth:`Controller.clone` on the configured prototype once
per episode, synchronously, before anything awaits. The default clone is a
deep copy; override it when a cheaper copy is safe.

A controller that holds resources shared by every episode (a multi-turn
environment backed by a second engine) acquires them in ``async start()`` and
releases them in ``async close()``: ``scaffold run`` calls both on the
prototype, on the run's event loop, after the engine starts and before it
closes. Both default to doing nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .episode import Outcome

if TYPE_CHECKING:
    from .episode import EpisodeContext

ProcessGenerator = Generator[Any, Any, Outcome]


class Controller:
    """Base class of controllers."""

    def clone(self) -> Controller:
        """A copy that shares no mutable state with ``self`` (default: ``copy.deepcopy``)."""
        return copy.deepcopy(self)

    async def start(self) -> None:
        """Acquire resources shared by every episode (called once per run, on its event loop)."""

    async def close(self) -> None:
        """Release what :meth:`start` acquired. Called once at the end of a run, even a failed one; safe twice."""

    def process(self, ctx: EpisodeContext) -> ProcessGenerator:  # pragma: no cover - interface
        raise NotImplementedError
        yield  # make this a generator for type checkers

    def parallel(self, sub: Controller, contexts: Iterable[EpisodeContext]) -> Parallel:
        """Branches that run ``sub`` on each context, each branch on its own clone of ``sub``."""
        return Parallel([Branch(sub.clone(), c) for c in contexts])


async def start_controller(controller: Any) -> None:
    """``await controller.start()`` when it has one (controllers need not subclass :class:`Controller`)."""
    start = getattr(controller, "start", None)
    if start is not None:
        await start()


async def close_controller(controller: Any) -> None:
    """``await controller.close()`` when it has one."""
    close = getattr(controller, "close", None)
    if close is not None:
        await close()


@dataclass(slots=True, eq=False)
class Branch:
    controller: Controller
    ctx: EpisodeContext


@dataclass(slots=True, eq=False)
class Parallel:
    """Run several sub-controllers concurrently; ``yield`` returns their Outcomes in order."""

    branches: list[Branch] = field(default_factory=list)
