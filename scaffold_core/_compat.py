"""Import paths kept working after the core was laid out in subpackages.

Plugins and scripts written against the earlier flat layout keep importing
``scaffold_core.workers``, ``scaffold_core.ports`` and so on. Each old module
path below is an alias of the module that now holds the code (the very same
module object, so ``monkeypatch`` on either name patches both), and
``python -m scaffold_core.worker`` still starts a worker. Names that moved out
of a contract module are listed in :data:`MOVED_NAMES`.

Targets are strings resolved on first use, so this module depends on nothing
in the package; ``scaffold_core/__init__.py`` installs the finder.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

#: Old module path -> the module that holds its code now.
MOVED_MODULES: dict[str, str] = {
    "scaffold_core.hookimpl": "scaffold_core.plugins.markers",
    "scaffold_core.hookspecs": "scaffold_core.plugins.hookspecs",
    "scaffold_core.hooks": "scaffold_core.plugins.lifecycle",
    "scaffold_core.registry": "scaffold_core.plugins.registry",
    "scaffold_core.options": "scaffold_core.plugins.options",
    "scaffold_core.runtime": "scaffold_core.run.runtime",
    "scaffold_core.rollout": "scaffold_core.run.rollout",
    "scaffold_core.metrics": "scaffold_core.run.metrics",
    "scaffold_core.score": "scaffold_core.run.score",
    "scaffold_core.verifier_processes": "scaffold_core.run.verifier_processes",
    "scaffold_core.workers": "scaffold_core.launch",
    "scaffold_core.worker": "scaffold_core.launch.worker",
    "scaffold_core.ray_launcher": "scaffold_core.launch.ray",
    "scaffold_core.net": "scaffold_core.distributed.net",
    "scaffold_core.ports": "scaffold_core.distributed.ports",
    "scaffold_core.microbatch": "scaffold_core.train.microbatch",
    "scaffold_core.newplugin": "scaffold_core.cli.new_plugin",
}

#: (old module, name) -> the module that defines the name now.
MOVED_NAMES: dict[tuple[str, str], str] = {
    ("scaffold_core.verifier", "VerifierPool"): "scaffold_core.run.verifier_pool",
    ("scaffold_core.verifier", "ExactMatchVerifier"): "scaffold_core.builtins.verifiers",
    ("scaffold_core.plugins.registry", "current_registry"): "scaffold_core.plugins.manager",
    ("scaffold_core.trajectory", "to_padded_tensor_dict"): "scaffold_core.train.padding",
    ("scaffold_core.trajectory", "TENSOR_KEYS"): "scaffold_core.train.padding",
}


def moved_name(module: str, name: str) -> Any:
    """``module.name`` for a name that moved elsewhere; AttributeError for any other name."""
    target = MOVED_NAMES.get((module, name))
    if target is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return getattr(importlib.import_module(target), name)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target
        self.real_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias spec on the shared module: give it back its own.
        module.__spec__ = self.real_spec

    def get_code(self, fullname: str) -> Any:
        """What ``python -m OLD`` runs: the new module as ``__main__``."""
        return compile(f"import runpy\nrunpy.run_module({self.target!r}, run_name='__main__', alter_sys=True)\n",
                       f"<alias of {self.target}>", "exec")


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new), origin=f"alias of {new}")


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
