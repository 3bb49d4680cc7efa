"""The core-owned component registry that ``register_*`` hooks fill in.

Components are looked up by ``(kind, name)``. Every entry remembers which
plugin (and distribution) registered it, so conflicts and failures can name
the package at fault.
"""

from __future__ import annotations

import contextvars
import copy
import difflib
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .._meta import bare_name, split_name
from ..errors import ConfigError, DuplicateComponentError, PluginLoadError, UnknownComponentError
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


#: The plugin name the core's own components are registered under.
BUILTIN_PLUGIN = "builtin"

@dataclass(frozen=True)
class ComponentInfo:
    """One registered component."""

    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str
    distribution: str | None = None
    description: str = ""

    @property
    def provider(self) -> str:
        """Who registered it, for messages: ``plugin 'dupe' (scaffold-dupe)`` or ``the built-in (scaffold-core)``."""
        if self.plugin == BUILTIN_PLUGIN:
            return f"the built-in ({self.distribution or 'scaffold-core'})"
        return f"plugin {self.plugin!r} ({self.distribution or 'no distribution'})"

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
    """All registered components, plus what failed to load, for one process.

    A name registered for one kind by more than one plugin is a *clash*: it
    never resolves silently to one of them. Looking it up raises
    :class:`DuplicateComponentError` listing the providers and how to choose
    (a qualified ``plugin:name`` or ``distribution:name``, or disabling one);
    every other name keeps working.
    """

    def __init__(self) -> None:
        self._components: dict[str, dict[str, list[ComponentInfo]]] = {kind: {} for kind in KINDS}
        self.broken: dict[str, BrokenPlugin] = {}
        #: Entry-point plugins skipped by SCAFFOLD_DISABLE_PLUGINS: name -> distribution (for hints).
        self.disabled: dict[str, str | None] = {}

    # -- filling ---------------------------------------------------------
    def add_all(self, infos: list[ComponentInfo]) -> None:
        """Add components; a name that another plugin already registered becomes a clash."""
        for info in infos:
            providers = self._components[info.kind].setdefault(info.name, [])
            if any(p.factory is info.factory for p in providers):
                continue  # the same factory again (a plugin re-exporting another's): one provider
            providers.append(info)

    # -- clashes ---------------------------------------------------------
    def providers(self, kind: str, name: str) -> list[ComponentInfo]:
        """Every component registered as ``name`` for ``kind``, in registration order."""
        return list(self._components[kind].get(name, []))

    def clashes(self) -> list[DuplicateComponentError]:
        """One error per (kind, name) that more than one plugin registered."""
        return [self._clash(kind, name, providers)
                for kind, table in self._components.items()
                for name, providers in sorted(table.items()) if len(providers) > 1]

    def check(self) -> None:
        """Raise the first clash, if any (for callers that want none at all)."""
        clashes = self.clashes()
        if clashes:
            raise clashes[0]

    def _clash(self, kind: str, name: str, providers: list[ComponentInfo]) -> DuplicateComponentError:
        listed = " and ".join(p.provider for p in providers)
        choices = " or ".join(f"`name: {p.plugin}:{name}`" for p in providers)
        by_dist = [f"`name: {p.distribution}:{name}`" for p in providers if p.distribution]
        message = (f"{kind} {name!r} is registered by {len(providers)} plugins: {listed}. scaffold will not "
                   f"pick one for you: select one in the config with a qualified name, {choices}")
        if by_dist:
            message += f" (or by distribution, {' or '.join(by_dist)})"
        disable = [p.plugin for p in providers if p.plugin != BUILTIN_PLUGIN and p.distribution]
        if disable:
            message += (f"; or disable one plugin with "
                        f"{' or '.join(f'SCAFFOLD_DISABLE_PLUGINS={d}' for d in disable)}")
        if any(p.plugin == BUILTIN_PLUGIN for p in providers):
            message += "; built-ins cannot be disabled: a plugin should not reuse a built-in's name"
        return DuplicateComponentError(
            message + ".", kind=kind, name=name, plugins=tuple(p.plugin for p in providers),
            distributions=tuple(p.distribution for p in providers))

    # -- lookup ----------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        return sorted(self._components[kind])

    def components(self, kind: str) -> list[ComponentInfo]:
        """Every registered component of ``kind`` (a clashing name once per provider), sorted by name."""
        return [info for name in self.names(kind) for info in self._components[kind][name]]

    def by_plugin(self, plugin: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {kind: [] for kind in KINDS}
        for kind, table in self._components.items():
            out[kind] = sorted(n for n, infos in table.items() if any(i.plugin == plugin for i in infos))
        return out

    def get(self, kind: str, name: str, *, path: str | None = None) -> ComponentInfo:
        """Return the component, or raise an error that says how to get it.

        ``name`` may be qualified, ``plugin:name`` or ``distribution:name``,
        to choose between plugins that registered the same name.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown component kind {kind!r}; kinds are {', '.join(KINDS)}")
        qualifier, bare = split_name(name)
        providers = self._components[kind].get(bare, [])
        if qualifier is not None:
            chosen = [p for p in providers if _same_name(qualifier, p.plugin) or
                      (p.distribution is not None and _same_name(qualifier, p.distribution))]
            if len(chosen) == 1:
                return chosen[0]
            if providers:
                where = f"{path}: " if path else ""
                raise UnknownComponentError(
                    f"{where}{kind} {name!r}: no plugin or distribution {qualifier!r} provides {kind} {bare!r}; "
                    f"it is provided by {' and '.join(p.provider for p in providers)}: write "
                    f"{' or '.join(repr(f'{p.plugin}:{bare}') for p in providers)}")
        elif len(providers) == 1:
            return providers[0]
        elif providers:
            raise self._clash(kind, bare, providers)
        for broken in self.broken.values():
            if bare in broken.components.get(kind, []) or broken.name == bare:
                raise PluginLoadError(
                    f"{kind} {bare!r} comes from plugin {broken.name!r} "
                    f"({broken.distribution or 'unknown distribution'}), which failed to load: "
                    f"{type(broken.error).__name__}: {broken.error}"
                ) from broken.error
        raise UnknownComponentError(self.unknown_message(kind, name, path=path))

    def unknown_message(self, kind: str, name: str, *, path: str | None = None) -> str:
        installed = self.names(kind)
        where = f"{path}: " if path else ""
        msg = f"{where}unknown {kind} {name!r}. Installed {kind}s: {', '.join(installed) or '(none)'}."
        bare = bare_name(str(name))
        close = difflib.get_close_matches(bare, installed, n=1, cutoff=0.6)
        if close:
            msg += f" Did you mean {close[0]!r}?"
        disabled = {plugin: dist for plugin, dist in self.disabled.items() if plugin == bare}
        if disabled:  # one name everywhere: plugin `NAME` (scaffold-NAME) adds `NAME` components
            plugin, dist = next(iter(disabled.items()))
            msg += (f" It may come from plugin {plugin!r} ({dist or 'no distribution'}), which is installed but "
                    f"disabled by SCAFFOLD_DISABLE_PLUGINS: remove {plugin!r} from that variable")
        else:
            msg += (" If it comes from a plugin that is not installed, install that plugin's package (docs/plugins.md "
                    "lists which package adds which component; wheels built by `make dist` in a scaffold checkout: "
                    "pip install --find-links dist PACKAGE)")
            if self.disabled:
                msg += f". Disabled by SCAFFOLD_DISABLE_PLUGINS: {', '.join(sorted(self.disabled))}"
        if self.broken:
            failed = ", ".join(f"{b.name} ({type(b.error).__name__})" for b in self.broken.values())
            msg += f". Plugins that failed to load: {failed}; see `scaffold list-plugins`"
        return msg + "."

    def create(self, kind: str, name: str, options: dict[str, Any] | None = None, *, path: str | None = None) -> Any:
        """Validate ``options`` and build the component (raises ConfigError naming ``path``)."""
        info = self.get(kind, name, path=path)
        with building(self, path or kind):
            return info.create(options, path=path or kind)

    def build(self, kind: str, spec: Any, *, path: str | None = None,
              accepts: Callable[[Any], bool] | None = None) -> Any:
        """A component from how an option names it: a registered name, a ``{name: ..., options...}`` mapping (its
        other keys are the options, validated and copied), or an object that is the component already, used as
        it is (by default anything but plain data; ``accepts`` narrows that, e.g. to objects with a ``step``).

        Anything else raises :class:`ConfigError` naming ``path``; a name nothing registered raises as
        :meth:`create` does.
        """
        where = path or kind
        if isinstance(spec, str):
            return self.create(kind, spec, {}, path=where)
        if isinstance(spec, Mapping):
            options = dict(spec)
            name = options.pop("name", None)
            if isinstance(name, str):
                return self.create(kind, name, copy.deepcopy(options), path=where)
        elif accepts(spec) if accepts is not None else not isinstance(spec, _DATA):
            return spec
        raise ConfigError(f"{where}: expected a registered {kind} name or {{name: ..., options...}}, got {spec!r}")


#: Values that are configuration data, never a component object.
_DATA = (type(None), bool, int, float, bytes, list, tuple, set, frozenset)


def _same_name(a: str, b: str) -> bool:
    """Distribution and plugin names compare as packaging does: case-insensitive, ``-``/``_``/``.`` alike."""
    def norm(text: str) -> str:
        return re.sub(r"[-_.]+", "-", text).lower()

    return norm(a) == norm(b)
