"""Plugin discovery, registration and the one place that decides what a failure means.

Failure policy (all of it lives here):

* A plugin that fails to import, fails hook validation (e.g. a misspelled
  hookimpl caught by ``check_pending``) or raises inside a ``register_*`` hook
  is listed with status ``error`` and its reason. Everything else keeps
  working. Selecting one of its components raises :class:`PluginLoadError`
  chained from the original cause.
* Two plugins registering the same name for one kind (a built-in's name
  included) is a *clash*: neither wins. Selecting the bare name raises
  :class:`DuplicateComponentError` listing both providers and how to choose
  (``plugin:name`` or ``distribution:name`` in the config, or disabling one);
  ``scaffold list-plugins`` marks both plugins with status ``clash`` and names
  the clash. Every other component keeps working.
* ``SCAFFOLD_DISABLE_PLUGINS=a,b`` skips plugins by entry-point name before
  they are imported.
* ``SCAFFOLD_EXTRA_PLUGINS=pkg.module,pkg.other:obj`` registers plugins that
  have no entry point (a debugging aid; worker processes inherit it). Each
  spec is a module, or ``module:attribute``; one that fails to import is
  listed with status ``error`` like a broken entry point.
* Built-in components register through the very same hooks; a failing
  built-in is a bug in scaffold and raises.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import pluggy

from .._meta import CORE_DISTRIBUTION, ENTRY_POINT_GROUP, PROJECT_NAME, version
from ..errors import DuplicateComponentError, PluginError
from . import hookspecs
from .kinds import KINDS
from .registry import BUILDING, BUILDING_PATH, BUILTIN_PLUGIN, BrokenPlugin, ComponentInfo, ComponentRegistry, Registry

DISABLE_ENV = "SCAFFOLD_DISABLE_PLUGINS"
EXTRA_ENV = "SCAFFOLD_EXTRA_PLUGINS"
BUILTIN = BUILTIN_PLUGIN

#: Built-in plugin modules, registered exactly like third-party plugins.
DEFAULT_PLUGINS: tuple[str, ...] = (
    "scaffold_core.builtins.controllers",
    "scaffold_core.builtins.repeat",
    "scaffold_core.builtins.engines",
    "scaffold_core.builtins.trajectories",
    "scaffold_core.builtins.verifiers",
)

#: Lifecycle hooks whose implementations must be wrappers.
WRAPPER_ONLY_HOOKS = {"engine_request"}


@dataclass
class PluginInfo:
    """What ``scaffold list-plugins`` shows for one plugin."""

    name: str
    distribution: str | None
    version: str | None
    status: str  # "ok" | "error" | "disabled" | "clash"
    error: str | None = None
    hooks: list[str] = field(default_factory=list)
    components: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    builtin: bool = False
    #: Names this plugin registered that another plugin registered too: kind, name and every provider.
    clashes: list[dict[str, Any]] = field(default_factory=list)
    #: What the plugin says about its state on this machine (the ``plugin_notes`` hook).
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "error": self.error,
            "hooks": self.hooks,
            "components": self.components,
            "clashes": self.clashes,
            "notes": self.notes,
        }


class PluginSet:
    """A plugin manager with its registry and per-plugin status."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.registry = Registry()
        self.infos: dict[str, PluginInfo] = {}
        self._dist_of: dict[str, tuple[str | None, str | None]] = {}
        #: Called with one line per plugin loaded and per registration hook call (SCAFFOLD_TRACE_PLUGINS).
        self.trace: Any = None

    # -- loading ---------------------------------------------------------
    def load(self, *, entry_points: bool = True, extra: dict[str, Any] | None = None) -> PluginSet:
        """Register built-ins, entry-point plugins (unless ``entry_points=False``) and ``extra``
        plugins (name -> module or object, or a ``"module[:attribute]"`` string imported here;
        tests use this), then build the registry."""
        for modname in DEFAULT_PLUGINS:
            module = importlib.import_module(modname)
            self.pm.register(module, name=f"{BUILTIN}:{modname.rsplit('.', 1)[-1]}")
        if entry_points:
            self._load_entry_points()
        for name, plugin in (extra or {}).items():
            self.infos[name] = PluginInfo(name, None, None, "ok")
            try:
                if isinstance(plugin, str):
                    plugin = import_spec(plugin)
                self.pm.register(plugin, name=name)
                if self.trace:
                    self.trace(f"loaded extra plugin {name!r}")
            except Exception as exc:
                if self.trace:
                    self.trace(f"failed to load extra plugin {name!r}: {type(exc).__name__}: {exc}")
                self._mark_broken(name, exc)
        self._validate_hooks()
        self._register_components()
        return self

    def _load_entry_points(self) -> None:
        from stevedore import NamedExtensionManager

        disabled = {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}
        names: list[str] = []
        for ep in _list_entry_points(ENTRY_POINT_GROUP):
            if ep.name in disabled:
                dist_name, version = self.dist_of(ep.name)
                self.infos[ep.name] = PluginInfo(ep.name, dist_name, version, "disabled",
                                                 error=f"disabled by {DISABLE_ENV}")
                self.registry.disabled[ep.name] = dist_name
            elif ep.name not in names:
                names.append(ep.name)
        failures: dict[str, BaseException] = {}

        def on_failure(_manager: Any, entrypoint: Any, exc: BaseException) -> None:
            failures[entrypoint.name] = exc

        manager = NamedExtensionManager(
            ENTRY_POINT_GROUP,
            names=names,
            invoke_on_load=False,
            on_load_failure_callback=on_failure,
            name_order=True,
        )
        for name, exc in failures.items():
            if self.trace:
                self.trace(f"failed to import plugin {name!r}: {type(exc).__name__}: {exc}")
            self._mark_broken(name, exc, message=f'error importing plugin "{name}": {type(exc).__name__}: {exc}')
        for ext in manager.extensions:
            if self.trace:
                self.trace(f"loaded plugin {ext.name!r} from {getattr(ext.entry_point, 'value', '?')}")
            self.infos[ext.name] = PluginInfo(ext.name, None, None, "ok")
            try:
                self.pm.register(ext.plugin, name=ext.name)
            except Exception as exc:  # hook validation failed (bad signature, non-generator wrapper, ...)
                self._mark_broken(ext.name, exc)

    def dist_of(self, plugin: str) -> tuple[str | None, str | None]:
        """(distribution name, version) of the plugin's entry point; looked up only when needed."""
        if not self._dist_of:
            from importlib.metadata import entry_points

            for ep in entry_points(group=ENTRY_POINT_GROUP):
                dist = getattr(ep, "dist", None)
                if dist is not None and ep.name not in self._dist_of:
                    self._dist_of[ep.name] = (dist.metadata["Name"], dist.version)
            self._dist_of.setdefault("", (None, None))
        return self._dist_of.get(plugin, (None, None))

    def _validate_hooks(self) -> None:
        """``check_pending`` per plugin, so one misspelled hookimpl only breaks its own plugin."""
        known = set(_hook_names())
        for name, plugin in list(self.pm.list_name_plugin()):
            if plugin is None:
                continue
            for impl in _impls_of(self.pm, plugin):
                hook_name = impl[0]
                opts = impl[1]
                if hook_name not in known and not opts.get("optionalhook"):
                    close = difflib.get_close_matches(hook_name, sorted(known), n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    self._fail_plugin(name, PluginError(
                        f"plugin {name!r} implements {hook_name!r}, which is not a scaffold hook{hint} "
                        f"(hooks: {', '.join(sorted(known))})"))
                    break
                if hook_name in WRAPPER_ONLY_HOOKS and not opts.get("wrapper"):
                    self._fail_plugin(name, PluginError(
                        f"plugin {name!r}: {hook_name} implementations must be wrappers: "
                        f"use @hookimpl(wrapper=True) and yield once"))
                    break
        self.pm.check_pending()  # anything left is a bug in the checks above

    def _register_components(self) -> None:
        """Call every ``register_*`` hook, staging each plugin's components; a plugin that raises
        adds none of them. Then add the staged components plugin by plugin and mark clashes."""
        staged: dict[str, list[ComponentInfo]] = {}
        for kind in KINDS.values():
            hook = getattr(self.pm.hook, kind.hook)
            for impl in hook.get_hookimpls():  # registration order: built-ins first
                if impl.plugin_name not in self.registry.broken:
                    self._call_register_hook(kind.name, kind.hook, impl, staged)
        order = list(dict.fromkeys(self._owner(name) for name, _ in self.pm.list_name_plugin()))
        for owner in sorted(staged, key=lambda o: order.index(o) if o in order else len(order)):
            if owner not in self.registry.broken:  # in registration order: built-ins first
                self.registry.add_all(staged[owner])
        for clash in self.registry.clashes():
            for plugin in clash.plugins:
                info = self.infos.get(plugin)
                if info is not None and info.status in ("ok", "clash"):
                    info.status = "clash"
                    info.clashes.append(clash_record(clash))
                    info.error = "; ".join(c["message"] for c in info.clashes)

    def _call_register_hook(self, kind: str, hook_name: str, impl: Any,
                            staged: dict[str, list[ComponentInfo]]) -> None:
        plugin_name = impl.plugin_name
        owner = self._owner(plugin_name)
        dist = CORE_DISTRIBUTION if owner == BUILTIN else self.dist_of(owner)[0]
        sink = staged.setdefault(owner, [])
        view = ComponentRegistry(kind, owner, dist, sink)
        before = len(sink)
        try:
            impl.function(**{arg: view for arg in impl.argnames})
        except Exception as exc:
            if self.trace:
                self.trace(f"{plugin_name}: {hook_name} raised {type(exc).__name__}: {exc}")
            if owner == BUILTIN:
                raise
            self._fail_plugin(plugin_name, exc, staged=sink, message=(
                f"plugin {plugin_name!r} raised in {hook_name}: {type(exc).__name__}: {exc}"))
        else:
            if self.trace:
                added = ", ".join(info.name for info in sink[before:]) or "nothing"
                self.trace(f"{plugin_name}: {hook_name} added {added}")

    # -- commands --------------------------------------------------------
    def add_commands(self, subparsers: Any) -> list[str]:
        """Let every plugin add its ``scaffold`` subcommands (the ``register_commands`` hook) to ``subparsers``.

        A plugin that raises, or takes a command name already taken, adds none of its commands; every other
        plugin's commands stay. Returns one warning per such plugin."""
        warnings: list[str] = []
        for impl in self.pm.hook.register_commands.get_hookimpls():
            before = dict(subparsers.choices)
            actions = list(subparsers._choices_actions)
            try:
                impl.function(**{arg: subparsers for arg in impl.argnames})
            except Exception as exc:
                if self._owner(impl.plugin_name) == BUILTIN:
                    raise
                subparsers.choices.clear()
                subparsers.choices.update(before)
                subparsers._choices_actions[:] = actions
                warnings.append(f"plugin {impl.plugin_name!r} added no commands: it raised in register_commands: "
                                f"{type(exc).__name__}: {exc}")
        return warnings

    # -- failure bookkeeping --------------------------------------------
    def _owner(self, plugin_name: str) -> str:
        return BUILTIN if plugin_name.startswith(f"{BUILTIN}:") else plugin_name

    def _fail_plugin(self, name: str, exc: BaseException, *, message: str | None = None,
                     staged: list[ComponentInfo] | None = None) -> None:
        if self._owner(name) == BUILTIN:
            raise exc
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin, name=name)
        self._mark_broken(name, exc, message=message, staged=staged)

    def _mark_broken(self, name: str, exc: BaseException, *, message: str | None = None,
                     staged: list[ComponentInfo] | None = None) -> None:
        dist_name, version = self.dist_of(name)
        components: dict[str, list[str]] = {k: [] for k in KINDS}
        for component in staged or []:
            components[component.kind].append(component.name)
        self.registry.broken[name] = BrokenPlugin(name, dist_name, exc, components)
        info = self.infos.get(name) or PluginInfo(name, dist_name, version, "error")
        info.status = "error"
        info.error = message or f"{type(exc).__name__}: {exc}"
        info.components = components
        self.infos[name] = info

    # -- listing ---------------------------------------------------------
    def plugin_infos(self, *, include_builtin: bool = False) -> list[PluginInfo]:
        out = []
        for name, info in sorted(self.infos.items()):
            info.distribution, info.version = self.dist_of(name)
            plugin = self.pm.get_plugin(name)
            if plugin is not None:
                info.hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
            if info.status not in ("error", "disabled"):
                info.components = self.registry.by_plugin(name)
                info.notes = self._notes(plugin)
            out.append(info)
        if include_builtin:
            hooks: set[str] = set()
            for name, plugin in self.pm.list_name_plugin():
                if name.startswith(f"{BUILTIN}:") and plugin is not None:
                    hooks.update(h.name for h in self.pm.get_hookcallers(plugin) or [])
            clashes = [clash_record(c) for c in self.registry.clashes() if BUILTIN in c.plugins]
            out.insert(0, PluginInfo(BUILTIN, CORE_DISTRIBUTION, version(), "clash" if clashes else "ok",
                                     error="; ".join(c["message"] for c in clashes) or None, hooks=sorted(hooks),
                                     components=self.registry.by_plugin(BUILTIN), builtin=True, clashes=clashes))
        return out


    def _notes(self, plugin: Any) -> list[str]:
        """The plugin's ``plugin_notes``; a note that fails is shown as its error."""
        for impl in self.pm.hook.plugin_notes.get_hookimpls():
            if plugin is not None and impl.plugin is plugin:
                try:
                    lines: Any = impl.function()
                    return [str(line) for line in lines or []]
                except Exception as exc:
                    return [f"plugin_notes failed: {type(exc).__name__}: {exc}"]
        return []


def clash_record(clash: DuplicateComponentError) -> dict[str, Any]:
    """A clash as ``list-plugins --json`` shows it: kind, name, message and every provider."""
    return {"kind": clash.kind, "name": clash.name, "message": str(clash),
            "providers": [{"plugin": p, "distribution": d} for p, d in zip(clash.plugins, clash.distributions)]}


def _hook_names() -> list[str]:
    return [n for n in dir(hookspecs) if not n.startswith("_") and hasattr(getattr(hookspecs, n), "scaffold_spec")]


def _impls_of(pm: pluggy.PluginManager, plugin: Any) -> list[tuple[str, dict]]:
    """(hook name, hookimpl options) for every function of ``plugin`` marked as a hookimpl."""
    out = []
    for attr in dir(plugin):
        try:
            method = getattr(plugin, attr)
        except Exception:
            continue
        opts = pm.parse_hookimpl_opts(plugin, attr)
        if opts is None or not callable(method):
            continue
        out.append((opts.get("specname") or attr, dict(opts)))
    return out


def _list_entry_points(group: str) -> list[Any]:
    from stevedore import ExtensionManager

    # A test instance loads nothing; list_entry_points reads stevedore's entry-point cache.
    return list(ExtensionManager.make_test_instance([], namespace=group).list_entry_points())


def import_spec(spec: str) -> Any:
    """Import ``"module"`` or ``"module:attribute"`` (dots allowed in the attribute path)."""
    module_name, _, attr = spec.strip().partition(":")
    if not module_name:
        raise PluginError(f"{EXTRA_ENV}: {spec!r} names no module; write module or module:attribute")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


def extra_plugin_specs(environ: Any = None) -> dict[str, str]:
    """Plugins named by ``$SCAFFOLD_EXTRA_PLUGINS`` (comma-separated specs), keyed by spec."""
    text = (os.environ if environ is None else environ).get(EXTRA_ENV, "")
    return {spec.strip(): spec.strip() for spec in text.split(",") if spec.strip()}


_LOCK = threading.Lock()
_CURRENT: PluginSet | None = None


def get_plugins(*, reload: bool = False) -> PluginSet:
    """The process-wide plugin set, loaded on first use.

    ``SCAFFOLD_TRACE_PLUGINS=1`` prints to stderr each plugin loaded, each
    registration hook call with what it added (or raised), and pluggy's trace
    of hooks called through the plugin manager.
    """
    global _CURRENT
    with _LOCK:
        if _CURRENT is None or reload:
            plugins = PluginSet()
            if os.environ.get("SCAFFOLD_TRACE_PLUGINS"):
                plugins.pm.trace.root.setwriter(sys.stderr.write)
                plugins.pm.enable_tracing()
                plugins.trace = lambda line: sys.stderr.write(f"scaffold-trace: {line}\n")
            _CURRENT = plugins.load(extra=extra_plugin_specs())
        return _CURRENT


def get_registry() -> Registry:
    """The process-wide registry (of :func:`get_plugins`)."""
    return get_plugins().registry


def current_registry() -> Registry:
    """The registry building the current component, else the process-wide one.

    A factory that builds sub-components by name (a controller naming its
    generator, a multi-turn controller naming its environment) looks them up
    here, so a test's own plugin set is honoured.
    """
    registry = BUILDING.get()
    return registry if registry is not None else get_registry()


def current_path(default: str) -> str:
    """The config key path of the component being built (``controller.generator``), else ``default``.

    A factory that builds sub-components names them under it in its errors
    (``controller.generator.tools[1].top_k: ...``), wherever it sits in the config.
    """
    path = BUILDING_PATH.get()
    return path if path else default


def set_plugins(plugins: PluginSet | None) -> PluginSet | None:
    """Replace the process-wide plugin set (tests); returns the previous one."""
    global _CURRENT
    with _LOCK:
        previous, _CURRENT = _CURRENT, plugins
        return previous


def build_tool_format(spec: Any, path: str) -> Any:
    """The tool-call format ``spec`` names (a name, ``{name: ..., options...}`` or a format object), for controllers
    that let the model call tools; raises :class:`ConfigError` naming ``path``."""
    from ..errors import ConfigError, PluginLoadError, UnknownComponentError

    try:
        fmt = current_registry().build("tool_format", spec, path=path,
                                       accepts=lambda obj: callable(getattr(obj, "parse", None)))
    except (UnknownComponentError, PluginLoadError) as exc:
        raise ConfigError(str(exc) if str(exc).startswith(path) else f"{path}: {exc}") from exc
    for method in ("prompt", "parse", "result_messages"):
        if not callable(getattr(fmt, method, None)):
            raise ConfigError(f"{path}: {type(fmt).__name__} has no {method}() method; a tool format implements "
                              "prompt(), parse() and result_messages() (scaffold_core.tool_format.ToolFormat)")
    return fmt
