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
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generator, Iterable

from .episode import Outcome

if TYPE_CHECKING:
    from .episode import EpisodeContext

ProcessGenerator = Generator[Any, Any, Outcome]


class Controller:
    """Base class of controllers."""

    def clone(self) -> Controller:
        """A copy that shares no mutable state with ``self`` (default: ``copy.deepcopy``)."""
        return copy.deepcopy(self)

    def process(self, ctx: EpisodeContext) -> ProcessGenerator:  # pragma: no cover - interface
        raise NotImplementedError
        yield  # make this a generator for type checkers

    def parallel(self, sub: Controller, contexts: Iterable[EpisodeContext]) -> Parallel:
        """Branches that run ``sub`` on each context, each branch on its own clone of ``sub``."""
        return Parallel([Branch(sub.clone(), c) for c in contexts])


@dataclass(slots=True, eq=False)
class Branch:
    controller: Controller
    ctx: EpisodeContext


@dataclass(slots=True, eq=False)
class Parallel:
    """Run several sub-controllers concurrently; ``yield`` returns their Outcomes in order."""

    branches: list[Branch] = field(default_factory=list)
