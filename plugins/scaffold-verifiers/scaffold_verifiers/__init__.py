"""scaffold-verifiers: environments written for ``verifiers`` (0.4.x, the ``verifiers.v1`` API) as scaffold tasks.

Components (hookimpls only; the logic lives in sibling modules):

* task ``verifiers`` (:class:`scaffold_verifiers.task.VerifiersTask`): a taskset's tasks (prompt, system
  prompt, few-shot turns) as prompts; its default verifier is the environment's rubric;
* verifier ``verifiers`` (:class:`scaffold_verifiers.verifier.VerifiersRubric`): the task's weighted
  ``@vf.reward`` functions (async ones included) and ``@vf.metric`` functions, run by the library's own
  scoring on the response; each function's value is kept in the sample's verdict metrics.

Single-turn environments only, today: what multi-turn, tool and judge environments need is in
:mod:`scaffold_verifiers.environment`. ``verifiers`` is imported only when a task or verifier is built.
"""

from __future__ import annotations

from scaffold_core import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_tasks(registry):
    from .task import VerifiersTask

    registry.add("verifiers", VerifiersTask)


@hookimpl
def register_verifiers(registry):
    from .verifier import VerifiersRubric

    registry.add("verifiers", VerifiersRubric)
