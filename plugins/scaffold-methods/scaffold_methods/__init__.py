"""scaffold-methods: inference-time scaling methods as controllers and verifiers, each yielding training data.

Components (hookimpls only; the logic lives in sibling modules):

* controller ``deepconf`` (:mod:`scaffold_methods.deepconf`): confidence-filtered, confidence-weighted
  voting, offline or online with early stopping;
* controller ``dynasor`` (:mod:`scaffold_methods.dynasor`): chunked reasoning stopped when probes agree;
* controller ``tree_search`` (:mod:`scaffold_methods.tree_search`): step-level beam or best-first search
  scored by a process reward;
* controller ``rerank`` (:mod:`scaffold_methods.rerank`): best-of-N chosen by a judge or reward model;
* verifier ``judge`` (:mod:`scaffold_methods.judge`): an LLM judge on any engine or an OpenAI-compatible URL;
* verifier ``reward_model`` (:mod:`scaffold_methods.reward_model`): a reward-model checkpoint, batched;
* task and verifier ``small_arithmetic`` (:mod:`scaffold_methods.arithmetic`): small sums made from a seed.
"""

from __future__ import annotations

from typing import Any

from scaffold_core import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_controllers(registry):
    from .deepconf import DeepConfController
    from .dynasor import DynasorController
    from .rerank import RerankController
    from .tree_search import TreeSearchController

    registry.add("deepconf", DeepConfController)
    registry.add("dynasor", DynasorController)
    registry.add("tree_search", TreeSearchController)
    registry.add("rerank", RerankController)


@hookimpl
def register_verifiers(registry):
    from .arithmetic import ArithmeticVerifier
    from .judge import JudgeVerifier
    from .reward_model import RewardModelVerifier

    registry.add("judge", JudgeVerifier)
    registry.add("reward_model", RewardModelVerifier)
    registry.add("small_arithmetic", ArithmeticVerifier)


@hookimpl
def register_tasks(registry):
    from .arithmetic import ArithmeticTask

    registry.add("small_arithmetic", ArithmeticTask)


@hookimpl
def on_run_end(metrics: dict[str, Any], output_dir: str | None) -> None:
    """Release the threads judges and reward models started for verifier threads (restarted if used again)."""
    import sys

    judge = sys.modules.get(f"{__name__}.judge")
    if judge is not None:
        for verifier in list(judge.LIVE):
            verifier.close_private()
    reward_model = sys.modules.get(f"{__name__}.reward_model")
    if reward_model is not None:
        for model in list(reward_model.LIVE):
            model.close_now()
