"""The project's identity, defined once: its name, entry-point group, core distribution and version."""

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
