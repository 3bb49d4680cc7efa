"""Checks a plugin's own tests make of its installation: listed, light to load, and its optional imports faked.

* :func:`listed_plugin`: the plugin's entry in ``scaffold list-plugins --json``
  (run in a fresh interpreter, as a user would);
* :func:`modules_loaded`: which of some heavy modules a fresh interpreter
  holds after importing the plugin's modules (a plugin imports its heavy
  dependencies lazily);
* :func:`fake_modules`: modules (their parent packages included) put into
  ``sys.modules`` for one test, so a plugin's import of an uninstalled
  dependency resolves to a test's fakes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any


def listed_plugin(name: str, *, timeout: float = 60.0) -> dict[str, Any]:
    """The entry ``scaffold list-plugins --json`` prints for plugin ``name`` (KeyError naming those listed if none)."""
    out = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "list-plugins", "--json"],
                         capture_output=True, text=True, timeout=timeout, check=True).stdout
    plugins = {p["name"]: p for p in json.loads(out)}
    if name not in plugins:
        raise KeyError(f"plugin {name!r} is not listed; listed: {sorted(plugins)}")
    return plugins[name]


def modules_loaded(imports: Iterable[str], watched: Iterable[str], *, timeout: float = 60.0) -> list[str]:
    """The modules of ``watched`` a fresh interpreter has loaded after importing ``imports`` (sorted)."""
    code = (f"import json, sys\nfor m in {list(imports)!r}: __import__(m)\n"
            f"print(json.dumps(sorted(m for m in {list(watched)!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=True)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def fake_modules(monkeypatch: Any, modules: Mapping[str, Mapping[str, Any]]) -> None:
    """Put ``{module name: {attribute: value}}`` into ``sys.modules`` with ``monkeypatch`` (undone after the test).

    Parent packages a name needs (``areal`` and ``areal.api`` for
    ``areal.api.io_struct``) are created empty unless ``modules`` lists them.
    """
    names: dict[str, Mapping[str, Any]] = {}
    for name, attrs in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            names.setdefault(".".join(parts[:i]), {})
        names[name] = attrs
    for name, attrs in names.items():
        module = types.ModuleType(name)
        for attr, value in attrs.items():
            setattr(module, attr, value)
        monkeypatch.setitem(sys.modules, name, module)
