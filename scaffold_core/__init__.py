"""scaffold: plugin-based LLM rollout scaffolding for reinforcement learning.

Plugin authors need one import: ``from scaffold_core import hookimpl``. The
rest of the public API is importable from here too, loaded on first use so
that ``scaffold list-plugins`` stays fast. ``docs/architecture.md`` maps the
package: the contracts sit flat in this folder, the machinery in subpackages.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from ._compat import install as _install_moved_paths
from .plugins.markers import hookimpl


class _Package(ModuleType):
    """The package module: ``import scaffold_core.hookimpl`` (the marker's earlier module path, an alias
    now) must not replace the ``hookimpl`` marker with that module, as importing a submodule normally would."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "hookimpl" and isinstance(value, ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
_install_moved_paths()

#: Public name -> the module that defines it.
_LAZY = {
    "Controller": "controller",
    "Parallel": "controller",
    "Branch": "controller",
    "Engine": "engine",
    "EpisodeContext": "episode",
    "EpisodeResult": "episode",
    "Outcome": "episode",
    "Sample": "episode",
    "GenerationTask": "generation",
    "VerificationTask": "generation",
    "AwaitTask": "generation",
    "GenerationRequest": "generation",
    "GenerationResult": "generation",
    "SamplingParams": "sampling",
    "Task": "task",
    "TrainingSample": "trajectory",
    "TrajectoryMaker": "trajectory",
    "Verdict": "verifier",
    "Verifier": "verifier",
    "load_config": "config",
    "render_chat": "tokenizers",
    "get_registry": "plugins",
    "current_registry": "plugins",
    "Runtime": "run.runtime",
    "to_padded_tensor_dict": "train.padding",
    "Trainer": "trainer",
    "TrainJob": "trainer",
    "TrainStep": "trainer",
    "TrainingRollouts": "train.rollouts",
}

__all__ = ["hookimpl", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from ._meta import version

        return version()
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scaffold_core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
