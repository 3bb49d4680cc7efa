"""The pluggy markers: ``hookspec`` for the core's specs, ``hookimpl`` for plugins' implementations.

Plugin authors import the implementation marker from the package root:
``from scaffold_core import hookimpl``.
"""

import pluggy

from .._meta import PROJECT_NAME

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
