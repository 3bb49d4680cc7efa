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
per episode, synchronously, before anything awaits. Isolation holds by
construction: the clone deep-copies every attribute except the shared
handles a class declares in ``shared`` (engines, tokenizers, environments,
tool clients: objects every episode may use at once and that keep no
per-episode state), and sub-controllers are copied by the same rule (their
own ``shared`` declarations apply). A subclass that adds any mutable attribute and overrides nothing
is therefore isolated. Immutable values (numbers, strings, tuples of them)
are shared, because a copy of them would be equal anyway: that is the only
shortcut, and it is checked per value, never assumed per class.

A controller that holds resources shared by every episode (a multi-turn
environment backed by a second engine) acquires them in ``async start()`` and
releases them in ``async close()``: ``scaffold run`` calls both on the
prototype, on the run's event loop, after the engine starts and before it
closes. Both default to doing nothing.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from ._cloning import Cloneable
from .episode import Outcome

if TYPE_CHECKING:
    from .episode import EpisodeContext

ProcessGenerator = Generator[Any, Any, Outcome]
_C = TypeVar("_C", bound="Controller")


class Controller(Cloneable):
    """Base class of controllers.

    ``shared``: names of attributes that hold **shared handles** (an
    environment backed by a second engine, a tokenizer, a tool client):
    every episode's clone refers to the same object instead of a copy. Declare
    only objects that keep no per-episode state. Declarations add up along
    the class hierarchy (a subclass's ``shared`` extends its bases').
    """

    shared: ClassVar[tuple[str, ...]] = ()

    def clone(self: _C) -> _C:
        """A copy that shares no mutable state with ``self``, except the attributes named in ``shared``.

        Attributes holding immutable values are reused, sub-controllers are
        copied by the same rule, everything else is deep-copied.
        Overriding this is rarely needed and easy to get wrong: declare shared
        handles in ``shared`` instead.
        """
        return cast(_C, self.__deepcopy__({}))

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


def samples_in_parallel(controller: Any, ctx: EpisodeContext) -> Generator[Any, Any, Outcome]:
    """``controller.samples`` conversations as parallel branches of a one-sample copy of ``controller``
    (each branch on its own clone, with its own copy of the episode's data); their metrics averaged."""
    single = controller.clone()
    single.samples = 1
    outcomes = yield controller.parallel(single, [ctx.branch(i) for i in range(controller.samples)])
    samples = [s for outcome in outcomes for s in outcome.samples]
    names = sorted({k for outcome in outcomes for k in outcome.metrics})
    metrics = {k: sum(o.metrics.get(k, 0.0) for o in outcomes) / len(outcomes) for k in names}
    return Outcome(samples=samples, metrics=metrics, prompt=next((o.prompt for o in outcomes if o.prompt), None))
