"""What every conformance base class shares: building the component under test by its registered name."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar

import pytest


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
        return self.scaffold_registry().create(self.kind, self.name, dict(self.options), path=self.kind)

    def test_registered_by_name(self) -> None:
        """The plugin registers the component under ``name`` and the registry can build it."""
        if self.name is None:
            pytest.skip("`name` is not set: registration is not checked")
        registry = self.scaffold_registry()
        assert self.name in registry.names(self.kind), (
            f"{self.kind} {self.name!r} is not registered; registered: {registry.names(self.kind)}")
        assert registry.create(self.kind, self.name, dict(self.options), path=self.kind) is not None


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
