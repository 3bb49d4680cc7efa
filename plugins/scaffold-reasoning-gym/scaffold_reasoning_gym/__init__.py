"""scaffold-reasoning-gym: reasoning-gym's procedural datasets as scaffold tasks.

Components (hookimpls only; the logic lives in sibling modules):

* task ``reasoning_gym`` (:class:`scaffold_reasoning_gym.task.ReasoningGymTask`): any of the library's datasets
  by name, generated with its config, size and seed; prompts as the library's evaluations build them;
* verifier ``reasoning_gym`` (:class:`scaffold_reasoning_gym.verifier.ReasoningGymVerifier`, the task's
  default): the answer extracted as the library extracts it, scored by the dataset's own ``score_answer``.

``reasoning_gym`` is imported only when a task or verifier is built.
"""

from __future__ import annotations

from scaffold_core import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_tasks(registry):
    from .task import ReasoningGymTask

    registry.add("reasoning_gym", ReasoningGymTask)


@hookimpl
def register_verifiers(registry):
    from .verifier import ReasoningGymVerifier

    registry.add("reasoning_gym", ReasoningGymVerifier)
