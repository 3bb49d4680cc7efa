"""Test helpers for scaffold and its plugins (also a pytest plugin: see ``pytest_plugin``).

* :func:`plugin_set` builds a registry with given plugins registered (and,
  by default, none of the installed entry points), for fast isolated tests.
* :class:`ScriptedEngine` is a tiny deterministic engine: a function of the
  prompt text decides the response; optional delays and injected faults.
* :class:`ListTask` is a task over an in-memory list of rows; :func:`build` builds a component from
  options as a config does (validated against its declaration first).
* :func:`run_episodes` runs contexts through a :class:`Runtime` and returns
  the results; :func:`run_one_episode` runs one task row end to end.
* :class:`LiveEngine` starts an engine on a background event loop so
  synchronous tests can share it (the ``smollm2_engine`` fixture is one).
* :class:`LoopLagMonitor` measures the longest time something held the
  event loop without yielding.
* :mod:`scaffold_testkit.conformance` holds the conformance base classes
  a plugin's tests subclass (imported on demand: it needs pytest).
* :mod:`scaffold_testkit.replies` scripts a fake inference server's
  answers (token ids in, token ids out); :mod:`scaffold_testkit.installed`
  checks a plugin's installation (listed, light to load, dependencies faked).
"""

from __future__ import annotations

from scaffold_core.plugins import lazy_exports

#: The public API, loaded on first use: the kit's ``scaffold new-plugin`` command loads this package with every
#: command.
PUBLIC = {"ScriptedEngine": "engines", "ListTask": "helpers", "build": "helpers", "make_contexts": "helpers",
          "plugin_set": "helpers", "run_episodes": "helpers", "run_one_episode": "helpers",
          "BackgroundLoop": "live", "LiveEngine": "live", "LoopLagMonitor": "live"}
__getattr__ = lazy_exports(__name__, PUBLIC)
__all__ = list(PUBLIC)
