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

import copy
import types
import weakref
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from .episode import Outcome

if TYPE_CHECKING:
    from .episode import EpisodeContext

ProcessGenerator = Generator[Any, Any, Outcome]
_C = TypeVar("_C", bound="Controller")

#: Types whose values a deep copy returns unchanged (``copy``'s own atomic types).
_ATOMIC: frozenset[type] = frozenset({
    type(None), bool, int, float, complex, str, bytes, range, type, types.FunctionType, types.CodeType,
    types.BuiltinFunctionType, type(Ellipsis), type(NotImplemented), weakref.ref, property,
})


def is_immutable(value: Any) -> bool:
    """True when ``value`` cannot be mutated: an atom, or a tuple/frozenset of such values (exact types only).

    Subclasses of these types may add mutable attributes, so only the exact
    types count.
    """
    kind = type(value)
    if kind in _ATOMIC:
        return True
    if kind is tuple or kind is frozenset:
        return all(is_immutable(item) for item in value)
    return False


class _ClonePlan:
    """How to clone instances of one class (worked out once per class)."""

    __slots__ = ("shared", "plain", "slots")

    def __init__(self, cls: type) -> None:
        shared: set[str] = set()
        for klass in cls.__mro__:
            declared = vars(klass).get("shared", ())
            if isinstance(declared, str) or not all(isinstance(n, str) for n in declared):
                raise TypeError(f"{klass.__qualname__}.shared must be a tuple of attribute names, "
                                f"e.g. shared = (\"environment\",); got {declared!r}")
            shared.update(declared)
        self.shared = frozenset(shared)
        # A class that customises pickling/copying keeps its own rules: it is copied through them.
        self.plain = all(getattr(cls, name, None) is getattr(Controller, name, None)
                         for name in ("__reduce_ex__", "__reduce__", "__getstate__", "__setstate__"))
        self.slots = tuple(dict.fromkeys(slot for klass in cls.__mro__
                                         for slot in _slot_names(klass) if slot not in ("__dict__", "__weakref__")))


def _slot_names(klass: type) -> tuple[str, ...]:
    slots = vars(klass).get("__slots__", ())
    return (slots,) if isinstance(slots, str) else tuple(slots)


_PLANS: weakref.WeakKeyDictionary[type, _ClonePlan] = weakref.WeakKeyDictionary()  # classes may come and go


_LAST: tuple[type, _ClonePlan] | None = None  # the class cloned last: a run clones one class thousands of times


def _plan(cls: type) -> _ClonePlan:
    global _LAST
    last = _LAST
    if last is not None and last[0] is cls:
        return last[1]
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _ClonePlan(cls)
    _LAST = (cls, plan)
    return plan


def shared_names(cls: type) -> frozenset[str]:
    """The attribute names ``cls`` and its bases declare in ``shared`` (copied by reference into every clone)."""
    return _plan(cls).shared


class Controller:
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

    def __deepcopy__(self, memo: dict[int, Any]) -> Controller:
        cls = type(self)
        plan = _plan(cls)
        shared = plan.shared
        if shared:
            for name in shared:
                handle = _get_attr(self, name)
                if handle is not _MISSING:
                    memo[id(handle)] = handle  # a deep copy of anything that refers to it keeps the original
        if not plan.plain:
            return _deepcopy_via_reduce(self, memo)
        twin = cls.__new__(cls)
        memo[id(self)] = twin
        state = _get_attr(self, "__dict__")
        if state:
            copied = twin.__dict__
            copied.update(state)
            for name, value in state.items():  # then replace every value that could be mutated by its copy
                if type(value) not in _ATOMIC and name not in shared and not is_immutable(value):
                    copied[name] = _copy_value(value, memo)
        if plan.slots:
            for name in plan.slots:
                value = _get_attr(self, name)
                if value is not _MISSING:
                    object.__setattr__(twin, name, value if name in shared or is_immutable(value)
                                       else copy.deepcopy(value, memo))
        return twin

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


_MISSING = object()


def _copy_value(value: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy(value, memo)``, going straight to a sub-controller's own ``__deepcopy__``."""
    if isinstance(value, Controller):
        done = memo.get(id(value), _MISSING)
        return value.__deepcopy__(memo) if done is _MISSING else done
    return copy.deepcopy(value, memo)


def _get_attr(obj: Any, name: str) -> Any:
    try:
        return object.__getattribute__(obj, name)
    except AttributeError:
        return _MISSING


def _deepcopy_via_reduce(obj: Any, memo: dict[int, Any]) -> Any:
    """Deep-copy ``obj`` through its own ``__reduce_ex__``/``__getstate__``/``__setstate__``."""
    reductor = obj.__reduce_ex__(4)
    if isinstance(reductor, str):  # a global: copied as itself
        return obj
    constructor, args, *rest = reductor
    state = rest[0] if rest else None
    twin = constructor(*copy.deepcopy(args, memo))
    memo[id(obj)] = twin
    if len(rest) > 1 and rest[1] is not None:  # a list subclass's items
        twin.extend(copy.deepcopy(item, memo) for item in rest[1])
    if len(rest) > 2 and rest[2] is not None:  # a dict subclass's items
        for key, value in rest[2]:
            twin[copy.deepcopy(key, memo)] = copy.deepcopy(value, memo)
    if state is not None:
        state = copy.deepcopy(state, memo)
        if hasattr(twin, "__setstate__"):
            twin.__setstate__(state)
        else:
            if isinstance(state, tuple) and len(state) == 2:
                state, slot_state = state
                for key, value in (slot_state or {}).items():
                    setattr(twin, key, value)
            if state:
                twin.__dict__.update(state)
    return twin


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
