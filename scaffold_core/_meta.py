"""The project's identity, defined once: its name, entry-point group, core distribution and version, and how a
component name is qualified by the plugin or distribution that provides it (``plugin:name``)."""

from __future__ import annotations

import functools

#: The project name: pluggy's marker name and the entry-point group plugins register under.
PROJECT_NAME = "scaffold"
#: ``[project.entry-points.scaffold]`` in a plugin's pyproject.toml.
ENTRY_POINT_GROUP = PROJECT_NAME
#: The distribution that ships ``scaffold_core``.
CORE_DISTRIBUTION = "scaffold-core"


@functools.cache
def version() -> str:
    """The installed version of scaffold-core, read from package metadata."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(CORE_DISTRIBUTION)
    except PackageNotFoundError:  # a source tree on sys.path without an install
        return "0+unknown"


def split_name(name: str) -> tuple[str | None, str]:
    """``"scaffold-dupe:hello"`` -> ``("scaffold-dupe", "hello")``; ``"hello"`` -> ``(None, "hello")``.

    A component name may be qualified by the plugin (entry-point name, ``builtin`` for the core's
    own) or the distribution that provides it, to choose between providers of one name.
    """
    qualifier, sep, bare = name.rpartition(":")
    return (qualifier or None) if sep else None, bare


def bare_name(name: str) -> str:
    """The component name without a ``plugin:`` or ``dist:`` qualifier."""
    return split_name(name)[1]
