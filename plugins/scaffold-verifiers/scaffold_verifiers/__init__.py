"""scaffold-verifiers: environments written for ``verifiers`` (0.4.x, the ``verifiers.v1`` API) as scaffold tasks.

Components (hookimpls only; the logic lives in sibling modules):

* task ``verifiers`` (:class:`scaffold_verifiers.task.VerifiersTask`): a taskset's tasks (prompt, system
  prompt, few-shot turns) as prompts; its default verifier is the environment's rubric;
* verifier ``verifiers`` (:class:`scaffold_verifiers.verifier.VerifiersRubric`): the task's weighted
  ``@vf.reward`` functions (async ones included) and ``@vf.metric`` functions, run by the library's own
  scoring on the response; each function's value is kept in the sample's verdict metrics.

* controller ``verifiers_rollout`` (:class:`scaffold_verifiers.rollout.VerifiersRolloutController`, the
  task's default): single-turn environments as ``native`` plays them; multi-turn, tool and judge
  environments through the library's own rollout, against a scaffold-serve session per episode, so their
  trajectories are token-faithful.

Which path an environment takes: :mod:`scaffold_verifiers.environment`. ``verifiers`` is imported only when a
task, verifier or controller is built.
"""

from __future__ import annotations

from scaffold_core import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_tasks(registry):
    from .task import VerifiersTask

    registry.add("verifiers", VerifiersTask)


@hookimpl
def register_controllers(registry):
    from .rollout import VerifiersRolloutController

    registry.add("verifiers_rollout", VerifiersRolloutController)


@hookimpl
def register_verifiers(registry):
    from .verifier import VerifiersRubric

    registry.add("verifiers", VerifiersRubric)
