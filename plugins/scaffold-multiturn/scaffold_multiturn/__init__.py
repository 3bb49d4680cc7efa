"""scaffold-multiturn: multi-turn chat rollouts with token-faithful trajectories for scaffold.

Components (hookimpls only; the logic lives in sibling modules):

* controller ``multiturn_chat`` (:class:`scaffold_multiturn.controller.MultiTurnChatController`)
* controller ``agent`` (:class:`scaffold_multiturn.agent.AgentController`): a tool-calling agent
* tool-call formats ``hermes`` and ``native`` (:mod:`scaffold_multiturn.tool_formats`)
* environments ``verifier_feedback`` (:mod:`scaffold_multiturn.feedback`) and
  ``simulated_user`` (:mod:`scaffold_multiturn.simulated_user`); the protocol
  third parties implement is in :mod:`scaffold_core.environment`
* trajectory maker ``multiturn`` (:class:`scaffold_multiturn.trajectory.MultiTurnTrajectoryMaker`)

GSM8K tasks that run on these (``multiturn_gsm8k``, ``gsm8k_calculator``) come with scaffold-gsm8k.
"""

from __future__ import annotations

from scaffold_core import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_controllers(registry):
    from .agent import AgentController
    from .controller import MultiTurnChatController

    registry.add("multiturn_chat", MultiTurnChatController)
    registry.add("agent", AgentController)


@hookimpl
def register_tool_formats(registry):
    from .tool_formats import HermesFormat, NativeFormat

    registry.add("hermes", HermesFormat)
    registry.add("native", NativeFormat)


@hookimpl
def register_environments(registry):
    from .feedback import VerifierFeedbackEnvironment
    from .simulated_user import SimulatedUserEnvironment

    registry.add("verifier_feedback", VerifierFeedbackEnvironment)
    registry.add("simulated_user", SimulatedUserEnvironment)


@hookimpl
def register_trajectory_makers(registry):
    from .trajectory import MultiTurnTrajectoryMaker

    registry.add("multiturn", MultiTurnTrajectoryMaker)

