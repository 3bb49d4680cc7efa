"""How the core copies per-episode state: controller clones and copies of an episode's data.

Private machinery behind :meth:`scaffold_core.controller.Controller.clone`
and :meth:`scaffold_core.episode.EpisodeContext.branch`; the contracts and
their rules are documented there. A clone deep-copies every attribute except
the shared handles a class declares in ``shared``, reuses immutable values,
copies sub-controllers by the same rule, and goes through a class's own
pickling hooks when it has them. Per-class work is done once per class.
"""

from __future__ import annotations

import copy
import types
import weakref
from typing import Any

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
        self.plain = all(getattr(cls, name, None) is getattr(Cloneable, name, None)
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


class Cloneable:
    """The clone machinery a :class:`~scaffold_core.controller.Controller` inherits: ``copy.deepcopy`` by the
    ``shared`` rule."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Cloneable:
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


_MISSING = object()


def _copy_value(value: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy(value, memo)``, going straight to a sub-controller's own ``__deepcopy__``."""
    if isinstance(value, Cloneable):
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


_DATA_ATOMS: frozenset[type] = frozenset({type(None), bool, int, float, str, bytes})


def copy_data(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """A deep copy of JSON-like data (dicts, lists, tuples, scalars), fast; anything else via ``copy.deepcopy``.

    Shared references inside ``value`` stay shared in the copy, and cycles
    are copied as cycles, exactly as ``copy.deepcopy`` does.
    """
    kind = type(value)
    if kind in _DATA_ATOMS:
        return value
    if memo is None:
        if kind is dict:  # the common case, a flat row of scalars, is a plain dict copy
            for item in value.values():
                if type(item) not in _DATA_ATOMS:
                    break
            else:
                return dict(value)
        memo = {}
    else:
        done = memo.get(id(value))
        if done is not None:
            return done
    if kind is dict:
        copied: dict[Any, Any] = {}
        memo[id(value)] = copied
        for key, item in value.items():
            copied[key] = item if type(item) in _DATA_ATOMS else copy_data(item, memo)
        return copied
    if kind is list:
        items: list[Any] = []
        memo[id(value)] = items
        items.extend(item if type(item) in _DATA_ATOMS else copy_data(item, memo) for item in value)
        return items
    return copy.deepcopy(value, memo)
