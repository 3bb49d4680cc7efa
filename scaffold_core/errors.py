"""Exception types raised by scaffold, all in one place (and :func:`require_module`, the one way to ask for an
optional dependency).

Every error a user can cause names the thing at fault and what would fix it.
Errors that code reacts to carry structured fields (``component``,
``plugin``, ``providers``), so nothing ever has to match a message's text.
"""

from __future__ import annotations

from typing import Any


class ScaffoldError(Exception):
    """Base class of every error scaffold raises on purpose."""


# -- plugins and components ---------------------------------------------------


class PluginError(ScaffoldError):
    """A plugin could not be loaded, validated or used."""


class PluginLoadError(PluginError):
    """A component was selected whose plugin failed to load (chained from the cause)."""


class DuplicateComponentError(PluginError):
    """Two plugins registered a component of the same kind under the same name (a name clash).

    ``kind`` and ``name`` identify the component; ``plugins`` lists the
    plugins that registered it, in registration order (``builtin`` for the
    core's own), and ``distributions`` their distributions (``None`` for a
    plugin registered without one).
    """

    def __init__(self, message: str, *, kind: str, name: str, plugins: tuple[str, ...],
                 distributions: tuple[str | None, ...] = ()):
        super().__init__(message)
        self.kind = kind
        self.name = name
        self.plugins = plugins
        self.distributions = distributions


class UnknownComponentError(ScaffoldError):
    """A config names a component that no installed plugin provides."""


class NewPluginError(ScaffoldError):
    """``scaffold new-plugin`` cannot generate the plugin as asked (bad name, existing folder, unknown kind)."""


# -- configuration and data -------------------------------------------------


class ConfigError(ScaffoldError):
    """The configuration is invalid. The message names the file, key path, value and what is allowed."""


class DataError(ScaffoldError):
    """A task's data cannot be used (under ``rollout.bad_rows: fail``, or nothing loads at all)."""


class RunDirError(ScaffoldError):
    """A run's output directory cannot be used as asked: a file in it is a symbolic link or unreadable,
    its saved config differs from the one resumed with, ... ``path`` is the file at fault."""

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path


class RunLockedError(RunDirError):
    """Another live ``scaffold run`` holds the output directory; ``pid`` and ``host`` name it."""

    def __init__(self, message: str, *, path: str | None = None, pid: int | None = None, host: str | None = None):
        super().__init__(message, path=path)
        self.pid = pid
        self.host = host


class MissingDependencyError(ScaffoldError):
    """An optional dependency is needed; the message carries the pip command that installs it."""


def require_module(*names: str, needed_by: str, install: str, what: str | None = None, load: bool = True) -> Any:
    """Import the modules ``names`` for ``needed_by`` (with ``load=False`` only check that they are installed).

    When one is missing, raises :class:`MissingDependencyError`: ``"{needed_by} needs {what} ({reason}); install
    it with: {install}"`` (``what`` defaults to the module names). Returns the module, a tuple of them for
    several names, or None with ``load=False``.
    """
    import importlib
    import importlib.util

    try:
        if not load:
            missing = [name for name in names if importlib.util.find_spec(name) is None]
            if missing:
                raise ModuleNotFoundError(f"No module named {missing[0]!r}")
            return None
        modules = tuple(importlib.import_module(name) for name in names)
    except ImportError as exc:
        raise MissingDependencyError(f"{needed_by} needs {what or ' and '.join(names)} ({exc}); install it with: "
                                     f"{install}") from exc
    return modules[0] if len(modules) == 1 else modules


# -- episodes ------------------------------------------------------------------


class EpisodeError(ScaffoldError):
    """An episode failed. ``component`` says which part failed (engine, verifier, controller, ...)."""

    def __init__(self, message: str, *, component: str = "episode"):
        super().__init__(message)
        self.component = component


class EngineError(EpisodeError):
    """The inference engine failed to serve a request.

    ``retryable`` (default True) says whether running the episode again may
    succeed; errors that would repeat (a prompt longer than the context) set it
    to False so ``rollout.retries`` is not wasted on them.
    """

    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message, component="engine")
        self.retryable = retryable


class ConstraintUnsupported(EngineError):
    """The engine cannot enforce the request's :class:`~scaffold_core.sampling.Constraint` (never ignored)."""

    def __init__(self, message: str):
        super().__init__(message, retryable=False)


class VerifierError(EpisodeError):
    """A verifier raised or exceeded its time budget."""

    def __init__(self, message: str):
        super().__init__(message, component="verifier")


class InvalidVerdictError(VerifierError):
    """A verifier returned something other than a Verdict, or a reward that is not a finite number
    within its declared ``reward_range``: the episode fails instead of training on it."""


class ControllerError(EpisodeError):
    """A controller broke its contract (yielded something unknown, returned no Outcome)."""

    def __init__(self, message: str):
        super().__init__(message, component="controller")


class TrajectoryError(EpisodeError):
    """A trajectory maker raised while turning an episode into training samples."""

    def __init__(self, message: str):
        super().__init__(message, component="trajectory")


class PluginHookError(EpisodeError):
    """A plugin's lifecycle hook raised; ``plugin`` names it."""

    def __init__(self, message: str, plugin: str):
        super().__init__(message, component=f"plugin:{plugin}")
        self.plugin = plugin


# -- tools ----------------------------------------------------------------------

#: The kinds of failure a tool result may report (``ToolResult.error``).
TOOL_ERROR_KINDS: tuple[str, ...] = ("bad_arguments", "timeout", "failed", "unknown_tool", "parse_error", "limit")


class ToolDefinitionError(PluginError):
    """A tool's definition (name, description, parameters schema, timeout, ``call``) is unusable."""


class ToolFormatError(ScaffoldError):
    """A tool-call format cannot present tools with this tokenizer (e.g. its chat template ignores ``tools=``)."""


class ToolCallError(ScaffoldError):
    """Raised inside ``Tool.call`` to fail the call with a given error kind and message.

    ``scaffold_core.tool.invoke_tool`` turns it into ``ToolResult(content=message, ok=False, error=kind)``.
    """

    def __init__(self, message: str, *, kind: str = "failed", metadata: dict[str, Any] | None = None):
        if kind not in TOOL_ERROR_KINDS:
            raise ValueError(f"ToolCallError kind {kind!r} is not one of {', '.join(TOOL_ERROR_KINDS)}")
        super().__init__(message)
        self.kind = kind
        self.metadata = dict(metadata or {})


# -- processes and networks -------------------------------------------------


class DistributedError(ScaffoldError):
    """A process group could not be set up, or a collective failed or timed out."""
