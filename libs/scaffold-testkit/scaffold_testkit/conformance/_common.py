"""What every conformance base class shares: building the component under test by its registered name."""

from __future__ import annotations

import math
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import pytest

from scaffold_core.plugins.kinds import KINDS

#: Class attributes the contracts define as read-only tables, per kind: allowed to be mutable
#: containers at class level, never to change.
READ_ONLY_TABLES: dict[str, frozenset[str]] = {
    "task": frozenset({"default_config"}),
    "tool": frozenset({"parameters"}),
}
#: The mutable container types class-level state is looked for in.
MUTABLE_TYPES: tuple[type, ...] = (list, dict, set, bytearray)


class ComponentConformance:
    """Base of the conformance classes.

    Point a subclass at the component under test in one of two ways:

    * set ``name`` (the registered name), ``plugin`` (your plugin module, or
      ``None`` for a built-in) and optionally ``options`` (what the YAML
      section would hold): the component is built through a registry exactly
      as ``scaffold run`` builds it, and ``test_registered_by_name`` checks
      the registration;
    * or override ``make_<kind>()`` to build it yourself.
    """

    #: The component kind (set by each conformance class).
    kind: ClassVar[str] = ""
    #: The plugin module (or object) that registers the component; ``None`` for a built-in.
    plugin: ClassVar[Any] = None
    #: The name the component is registered under (what a YAML config selects).
    name: ClassVar[str | None] = None
    #: Options passed to the factory, as a YAML section would.
    options: ClassVar[dict[str, Any]] = {}
    #: Class attributes that may be mutable containers because they are read-only tables (never changed).
    shared_attributes: ClassVar[Sequence[str]] = ()
    #: Seconds the event loop may go without running other work while the component works on it.
    max_loop_block: ClassVar[float] = 0.25

    def scaffold_registry(self) -> Any:
        """A registry with the built-ins and ``plugin`` registered (installed entry points left out)."""
        from ..helpers import plugin_set

        plugins = plugin_set() if self.plugin is None else plugin_set(**{_plugin_label(self.plugin): self.plugin})
        broken = plugins.registry.broken
        assert not broken, "; ".join(f"plugin {b.name!r} failed to load: {b.error!r}" for b in broken.values())
        return plugins.registry

    def build(self) -> Any:
        """The component named ``name``, built from ``options`` through the registry."""
        if self.name is None:
            raise NotImplementedError(
                f"{type(self).__name__}: set `name` (and `plugin`) to the registered {self.kind} name, "
                f"or override make_{self.kind}()")
        registry = self.scaffold_registry()
        with _building(registry):
            return self._own_component(registry).create(dict(self.options), path=self.kind)

    def _own_component(self, registry: Any) -> Any:
        """The registration of ``name`` by the plugin under test (others of that name are
        reported by ``test_name_is_unique``, not here)."""
        providers = registry.providers(self.kind, self.name)
        label = BUILTIN_LABEL if self.plugin is None else _plugin_label(self.plugin)
        mine = [p for p in providers if p.plugin == label]
        return mine[0] if len(mine) == 1 else registry.get(self.kind, self.name, path=self.kind)

    def make_component(self) -> Any:
        """The component under test, as the kind's ``make_<kind>()`` builds it."""
        return getattr(self, f"make_{self.kind}")()

    def test_registered_by_name(self) -> None:
        """The plugin registers the component under ``name`` and the registry can build it."""
        if self.name is None:
            pytest.skip("`name` is not set: registration is not checked")
        registry = self.scaffold_registry()
        assert self.name in registry.names(self.kind), (
            f"{self.kind} {self.name!r} is not registered; registered: {registry.names(self.kind)}")
        with _building(registry):
            assert self._own_component(registry).create(dict(self.options), path=self.kind) is not None

    # -- checks every kind shares ----------------------------------------
    def test_name_is_unique(self) -> None:
        """No component of the plugin reuses a name a built-in or another installed plugin registers
        for the same kind (users would have to qualify the name, and a bare one stops resolving)."""
        if self.plugin is None:
            pytest.skip("a built-in: its names are the ones plugins must not reuse")
        clashes = name_clashes(self.plugin, self.scaffold_registry())
        assert not clashes, (
            "name clash: " + "; ".join(clashes) + ". A clashing name no longer resolves on its own: users must "
            "write plugin:name in their configs or disable a plugin. Rename the component (e.g. prefix it with "
            "your plugin's name) in your register_* hook")

    def test_no_class_level_mutable_state(self) -> None:
        """The component's classes hold no mutable containers at class level: such state is shared by every
        instance and every clone, so per-episode cloning cannot isolate it."""
        component = self.make_component()
        allowed = set(self.shared_attributes) | READ_ONLY_TABLES.get(self.kind, frozenset())
        found = [where for where, _ in class_level_mutables(component, allowed)]
        assert not found, (
            f"class-level mutable state: {', '.join(found)} "
            f"{'is a mutable container' if len(found) == 1 else 'are mutable containers'} on the class, shared by "
            "every instance and every clone (clone() and rebuilding the component do not copy it), so what one "
            "episode or run stores there leaks into the others. Create it per instance in __init__ "
            "(self.x = []), keep per-episode data in ctx.state, or, for a table that is only read, make it "
            "immutable (a tuple, frozenset or types.MappingProxyType) or list it in `shared_attributes`")

    def assert_class_state_unchanged(self, component: Any, exercise: Callable[[], Any], what: str) -> Any:
        """Run ``exercise()``; fail if it changed a class-level container of ``component``'s classes."""
        before = class_state(component)
        value = exercise()
        after = class_state(component)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        assert not changed, (
            f"class-level mutable state changed by {what}: {', '.join(changed)}. It is shared by every instance "
            "and clone, so it carries data between episodes and runs. Keep per-episode data in ctx.state and "
            "per-instance data in attributes set in __init__")
        return value


BUILTIN_LABEL = "builtin"


def _building(registry: Any) -> Any:
    from scaffold_core.plugins.registry import building

    return building(registry)


def name_clashes(plugin: Any, registry: Any) -> list[str]:
    """What ``plugin`` registers under a name that a built-in (in ``registry``) or an installed plugin
    (entry points) also registers for the same kind, as messages naming both providers."""
    label = _plugin_label(plugin)
    mine = [info for kind in KINDS for info in registry.components(kind)
            if info.plugin == label or (info.plugin != BUILTIN_LABEL and _same_module(info.factory, plugin))]
    found: list[str] = []
    for info in mine:
        for other in registry.providers(info.kind, info.name):
            if other.plugin != info.plugin and other.factory is not info.factory:
                found.append(f"{info.kind} {info.name!r} is also registered by {other.provider}")
    try:
        from scaffold_core.plugins import get_plugins

        installed = get_plugins().registry
    except Exception:  # the installed set cannot load: nothing to compare against
        return found
    for info in mine:
        for other in installed.providers(info.kind, info.name):
            if other.factory is info.factory or other.plugin == "builtin":
                continue  # the plugin itself, installed; built-ins were compared above
            if not _same_module(other.factory, plugin):
                found.append(f"{info.kind} {info.name!r} is also registered by installed {other.provider}")
    return found


def _same_module(factory: Any, plugin: Any) -> bool:
    """Whether ``factory`` comes from the plugin's own package (an installed copy of the plugin under test)."""
    name = plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__
    package = name.split(".")[0]
    module = getattr(factory, "__module__", "") or ""
    return bool(package) and (module == package or module.startswith(package + "."))


def class_level_mutables(component: Any, allowed: set[str] | frozenset[str] = frozenset()) -> list[tuple[str, Any]]:
    """``("Class.attr", value)`` for each mutable container set at class level on the component's
    classes (and on those of its sub-controllers), other than dunders and ``allowed`` names."""
    found: list[tuple[str, Any]] = []
    seen: set[type] = set()
    for obj in _component_objects(component):
        for klass in type(obj).__mro__:
            if klass is object or klass in seen:
                continue
            seen.add(klass)
            for attr, value in vars(klass).items():
                if attr.startswith("__") or attr in allowed:
                    continue
                if isinstance(value, MUTABLE_TYPES):
                    found.append((f"{klass.__qualname__}.{attr}", value))
    return found


def class_state(component: Any) -> dict[str, Any]:
    """A comparable picture of every class-level container of the component's classes (allowed ones too)."""
    return {where: _picture(value) for where, value in class_level_mutables(component)}


def _component_objects(component: Any, depth: int = 0) -> list[Any]:
    """The component and the sub-controllers it holds (a controller's ``generator``, a branch's controller)."""
    out = [component]
    if depth > 4:
        return out
    for value in getattr(component, "__dict__", {}).values():
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if callable(getattr(item, "process", None)) and callable(getattr(item, "clone", None)):
                out += _component_objects(item, depth + 1)
    return out


def _picture(value: Any, depth: int = 0) -> Any:
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return value
    if depth > 6:
        return f"<{type(value).__qualname__}>"
    if isinstance(value, dict):
        return {repr(k): _picture(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_picture(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(repr(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return f"<{type(value).__qualname__} at {id(value):x}>"


def least_block(measure: Callable[[], float], bound: float, attempts: int = 3) -> float:
    """The smallest of up to ``attempts`` loop-block measurements, stopping at the first within ``bound``.

    Code that blocks the loop does so every time; a busy machine stalls a process only now and then.
    """
    best = math.inf
    for _ in range(attempts):
        best = min(best, measure())
        if best <= bound:
            break
    return best


def finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _plugin_label(plugin: Any) -> str:
    name = getattr(plugin, "__name__", None) or type(plugin).__name__
    return f"under-test:{name}"


def call_with_deadline(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """Run ``fn()`` on a daemon thread; fail the test if it has not returned within ``seconds``.

    A call that overruns is abandoned (the thread is a daemon, so it cannot
    block interpreter exit). Exceptions raised by ``fn`` are re-raised here.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="scaffold-conformance-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{what} did not finish within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def short(text: Any, limit: int = 60) -> str:
    """A short printable form of a (possibly huge) test input, for failure messages."""
    r = repr(text)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(text) if hasattr(text, '__len__') else '?'} chars)"
