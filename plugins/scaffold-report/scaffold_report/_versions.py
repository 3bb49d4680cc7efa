"""The core's distribution name and installed version, shown in every page's header and provenance table."""

from __future__ import annotations

CORE_DISTRIBUTION = "scaffold-core"


def version() -> str:
    """The installed scaffold-core's version (the core's own ``__version__``: read from package metadata)."""
    import scaffold_core

    return str(scaffold_core.__version__)
