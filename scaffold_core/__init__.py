"""scaffold: plugin-based LLM rollout scaffolding for reinforcement learning.

Plugin authors need one import: ``from scaffold_core import hookimpl``. The
rest of the public API is importable from here too, loaded on first use so
that ``scaffold list-plugins`` stays fast. ``docs/architecture.md`` maps the
package: the contracts sit flat in this folder, the machinery in subpackages.
"""

from __future__ import annotations

from typing import Any

from .plugins.markers import hookimpl

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
    "Trainer": "trainer",
    "TrainJob": "trainer",
    "TrainStep": "trainer",
    "TrainingRollouts": "train.prompt_groups",
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
