"""scaffold-gsm8k: the GSM8K grade-school math task and its answer verifiers for scaffold.

Components (hookimpls only; the logic lives in sibling modules):

* task ``gsm8k`` (:class:`scaffold_gsm8k.task.GSM8KTask`)
* tasks ``multiturn_gsm8k`` and ``gsm8k_calculator``
  (:mod:`scaffold_gsm8k.multiturn_tasks`): GSM8K for scaffold-multiturn's controllers
* verifier ``gsm8k`` (:class:`scaffold_gsm8k.verifier.GSM8KVerifier`)
* verifier ``math_verify`` (:class:`scaffold_gsm8k.math_verify_verifier.MathVerifyVerifier`),
  registered only when the optional ``math-verify`` extra is installed.
"""

from __future__ import annotations

import importlib.util

from scaffold_core import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_tasks(registry):
    from .multiturn_tasks import GSM8KCalculatorTask, MultiTurnGSM8KTask
    from .task import GSM8KTask

    registry.add("gsm8k", GSM8KTask)
    registry.add("multiturn_gsm8k", MultiTurnGSM8KTask)
    registry.add("gsm8k_calculator", GSM8KCalculatorTask)


@hookimpl
def register_verifiers(registry):
    from .verifier import GSM8KVerifier

    registry.add("gsm8k", GSM8KVerifier)
    if importlib.util.find_spec("math_verify") is not None:  # found without importing it (sympy is slow)
        from .math_verify_verifier import MathVerifyVerifier

        registry.add("math_verify", MathVerifyVerifier)
