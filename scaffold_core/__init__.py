"""scaffold: plugin-based LLM rollout scaffolding for reinforcement learning.

Plugin authors need one import: ``from scaffold_core import hookimpl``. The
rest of the public API is importable from here too, loaded on first use so
that ``scaffold list-plugins`` stays fast.
"""

from __future__ import annotations

from typing import Any

from .hookimpl import hookimpl

__version__ = "0.1.0"

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
    "to_padded_tensor_dict": "trajectory",
    "Verdict": "verifier",
    "Verifier": "verifier",
    "Runtime": "runtime",
    "load_config": "config",
    "get_registry": "plugins",
    "render_chat": "tokenizers",
}

__all__ = ["hookimpl", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scaffold_core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
