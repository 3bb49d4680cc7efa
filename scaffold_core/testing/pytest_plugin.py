"""scaffold's pytest plugin (entry point ``pytest11: scaffold``): fixtures for plugin tests.

Kept import-light: it loads in every pytest session of an environment where
scaffold-core is installed.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def scaffold_registry_factory():
    """Build registries with extra plugins: ``scaffold_registry_factory(my_plugin_module)``."""
    from . import plugin_set

    def factory(*plugins, entry_points: bool = False, **named):
        return plugin_set(*plugins, entry_points=entry_points, **named).registry

    return factory


@pytest.fixture
def scripted_engine():
    """A fresh deterministic :class:`ScriptedEngine` (responds ``#### 42``)."""
    from . import ScriptedEngine

    return ScriptedEngine()
