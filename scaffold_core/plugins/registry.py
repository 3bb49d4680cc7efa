"""The core-owned component registry that ``register_*`` hooks fill in.

Components are looked up by ``(kind, name)``. Every entry remembers which
plugin (and distribution) registered it, so conflicts and failures can name
the package at fault.
"""

from __future__ import annotations

import contextvars
import difflib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import DuplicateComponentError, PluginLoadError, UnknownComponentError
from .kinds import KINDS
from .options import build_component

#: The registry whose ``create`` is running: factories that build sub-components (a controller
#: naming its generator) look names up in it (``scaffold_core.plugins.current_registry``).
BUILDING: contextvars.ContextVar[Registry | None] = contextvars.ContextVar("scaffold_registry", default=None)
#: The config key path of the component being built (``controller``, ``controller.generator``): factories
#: that build sub-components name them under it in errors (``scaffold_core.plugins.current_path``).
BUILDING_PATH: contextvars.ContextVar[str | None] = contextvars.ContextVar("scaffold_building_path", default=None)


@contextmanager
def building(registry: Registry, path: str | None = None) -> Iterator[None]:
    """Make ``registry`` the one sub-components are looked up in (and ``path`` theirs), while a component is built."""
    token = BUILDING.set(registry)
    path_token = BUILDING_PATH.set(path)
    try:
        yield
    finally:
        BUILDING_PATH.reset(path_token)
        BUILDING.reset(token)


def __getattr__(name: str) -> Any:  # names that moved to another module stay importable from here
    from .._compat import moved_name

    return moved_name(__name__, name)


#: Which distribution adds a well-known component name (for install hints).
KNOWN_PROVIDERS: dict[str, str] = {
    "gsm8k": "scaffold-gsm8k",
    "multiturn_gsm8k": "scaffold-multiturn",
    "multiturn_chat": "scaffold-multiturn",
    "multiturn": "scaffold-multiturn",
    "sglang": "scaffold-sglang",
    "math_verify": 'scaffold-gsm8k[math-verify]',
    "calculator": "scaffold-tools",
    "python": "scaffold-tools",
    "search": "scaffold-tools",
    "agent": "scaffold-multiturn",
    "gsm8k_calculator": "scaffold-multiturn",
    "hermes": "scaffold-multiturn",
    "trl": "scaffold-trl",
}


@dataclass(frozen=True)
class ComponentInfo:
    """One registered component."""

    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str
    distribution: str | None = None
    description: str = ""

    def create(self, options: dict[str, Any] | None = None, *, path: str | None = None) -> Any:
        """Validate ``options`` against the factory's signature and build the component."""
        return build_component(self, options or {}, path=path or self.kind)


@dataclass
class BrokenPlugin:
    """A plugin that failed to load or register; selecting its components re-raises the cause."""

    name: str
    distribution: str | None
    error: BaseException
    components: dict[str, list[str]] = field(default_factory=dict)


class ComponentRegistry:
    """The object a ``register_<kind>s`` hook receives: add components of one kind.

    ``add(name, factory, description=None)`` registers ``factory`` under
    ``name``. ``factory(**options)`` must build the component; its keyword
    parameters (with type annotations) are the options users may set in YAML.
    """

    def __init__(self, kind: str, plugin: str, distribution: str | None, sink: list[ComponentInfo]):
        self.kind = kind
        self.plugin = plugin
        self.distribution = distribution
        self._sink = sink

    def add(self, name: str, factory: Callable[..., Any], *, description: str | None = None) -> None:
        if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(
                f"{self.kind} name {name!r} from plugin {self.plugin!r} is not valid: "
                "use letters, digits, '_' or '-'"
            )
        if not callable(factory):
            raise TypeError(f"{self.kind} {name!r} from plugin {self.plugin!r}: factory {factory!r} is not callable")
        doc = description if description is not None else _first_line(getattr(factory, "__doc__", None))
        self._sink.append(ComponentInfo(self.kind, name, factory, self.plugin, self.distribution, doc))

    def __repr__(self) -> str:
        return f"<ComponentRegistry kind={self.kind} plugin={self.plugin}>"


def _first_line(doc: str | None) -> str:
    return doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""


class Registry:
    """All registered components, plus what failed to load, for one process."""

    def __init__(self) -> None:
        self._components: dict[str, dict[str, ComponentInfo]] = {kind: {} for kind in KINDS}
        self.broken: dict[str, BrokenPlugin] = {}
        self.conflicts: list[DuplicateComponentError] = []

    # -- filling ---------------------------------------------------------
    def add_all(self, infos: list[ComponentInfo]) -> None:
        for info in infos:
            existing = self._components[info.kind].get(info.name)
            if existing is not None and existing.factory is not info.factory:
                self.conflicts.append(DuplicateComponentError(
                    f"{info.kind} {info.name!r} is registered twice: by plugin {existing.plugin!r} "
                    f"(distribution {existing.distribution or 'builtin'}) and by plugin {info.plugin!r} "
                    f"(distribution {info.distribution or 'builtin'}). Uninstall one of them, or disable "
                    f"one with SCAFFOLD_DISABLE_PLUGINS={info.plugin}",
                    kind=info.kind, name=info.name, plugins=(existing.plugin, info.plugin)))
                continue
            self._components[info.kind][info.name] = info

    def check(self) -> None:
        """Raise the first duplicate-name conflict, if any."""
        if self.conflicts:
            raise self.conflicts[0]

    # -- lookup ----------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        return sorted(self._components[kind])

    def components(self, kind: str) -> list[ComponentInfo]:
        return [self._components[kind][n] for n in self.names(kind)]

    def by_plugin(self, plugin: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {kind: [] for kind in KINDS}
        for kind, table in self._components.items():
            out[kind] = sorted(n for n, info in table.items() if info.plugin == plugin)
        return out

    def get(self, kind: str, name: str, *, path: str | None = None) -> ComponentInfo:
        """Return the component, or raise an error that says how to get it."""
        if kind not in KINDS:
            raise ValueError(f"unknown component kind {kind!r}; kinds are {', '.join(KINDS)}")
        self.check()
        info = self._components[kind].get(name)
        if info is not None:
            return info
        for broken in self.broken.values():
            if name in broken.components.get(kind, []) or broken.name == name:
                raise PluginLoadError(
                    f"{kind} {name!r} comes from plugin {broken.name!r} "
                    f"({broken.distribution or 'unknown distribution'}), which failed to load: "
                    f"{type(broken.error).__name__}: {broken.error}"
                ) from broken.error
        raise UnknownComponentError(self.unknown_message(kind, name, path=path))

    def unknown_message(self, kind: str, name: str, *, path: str | None = None) -> str:
        installed = self.names(kind)
        where = f"{path}: " if path else ""
        msg = f"{where}unknown {kind} {name!r}. Installed {kind}s: {', '.join(installed) or '(none)'}."
        close = difflib.get_close_matches(str(name), installed, n=1, cutoff=0.6)
        if close:
            msg += f" Did you mean {close[0]!r}?"
        provider = KNOWN_PROVIDERS.get(str(name))
        hint = provider or f"scaffold-{str(name).replace('_', '-')}"
        msg += f" If it comes from a plugin that is not installed: pip install {_shell_quote(hint)}"
        if self.broken:
            failed = ", ".join(f"{b.name} ({type(b.error).__name__})" for b in self.broken.values())
            msg += f". Plugins that failed to load: {failed}; see `scaffold list-plugins`."
        return msg

    def create(self, kind: str, name: str, options: dict[str, Any] | None = None, *, path: str | None = None) -> Any:
        """Validate ``options`` and build the component (raises ConfigError naming ``path``)."""
        info = self.get(kind, name, path=path)
        with building(self, path or kind):
            return info.create(options, path=path or kind)


def _shell_quote(spec: str) -> str:
    return f'"{spec}"' if "[" in spec else spec
