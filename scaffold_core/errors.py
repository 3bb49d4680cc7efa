"""Exception types raised by scaffold.

Every error a user can cause names the thing at fault and what would fix it.
"""

from __future__ import annotations


class ScaffoldError(Exception):
    """Base class of every error scaffold raises on purpose."""


class PluginError(ScaffoldError):
    """A plugin could not be loaded, validated or used."""


class PluginLoadError(PluginError):
    """A component was selected whose plugin failed to load (chained from the cause)."""


class DuplicateComponentError(PluginError):
    """Two plugins registered a component of the same kind under the same name."""


class UnknownComponentError(ScaffoldError):
    """A config names a component that no installed plugin provides."""


class ConfigError(ScaffoldError):
    """The configuration is invalid. The message names the file, key path, value and what is allowed."""


class DataError(ScaffoldError):
    """A task's data cannot be used (under ``rollout.bad_rows: fail``, or nothing loads at all)."""


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


class VerifierError(EpisodeError):
    """A verifier raised or exceeded its time budget."""

    def __init__(self, message: str):
        super().__init__(message, component="verifier")


class MissingDependencyError(ScaffoldError):
    """An optional dependency is needed; the message carries the pip command that installs it."""
