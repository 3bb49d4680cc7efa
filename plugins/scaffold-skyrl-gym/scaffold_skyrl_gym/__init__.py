"""scaffold-skyrl-gym: skyrl-gym's text environments as scaffold tasks.

Components (hookimpls only; the logic lives in sibling modules):

* task ``skyrl_gym`` (:class:`scaffold_skyrl_gym.task.SkyRLGymTask`): rows in SkyRL's dataset format
  (``prompt`` messages, ``env_class``, ``reward_spec``, ``extra_info``, ...), each naming its environment;
* controller ``gym_env`` (:class:`scaffold_skyrl_gym.controller.GymEnvController`): one conversation per
  episode with a fresh environment: each model turn is an action, each observation environment tokens
  (loss mask 0, version -1); per-step rewards kept, the episode's reward the environment's.

``skyrl_gym`` is imported only when an episode makes its environment.
"""

from __future__ import annotations

from scaffold_core import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_tasks(registry):
    from .task import SkyRLGymTask

    registry.add("skyrl_gym", SkyRLGymTask)


@hookimpl
def register_controllers(registry):
    from .controller import GymEnvController

    registry.add("gym_env", GymEnvController)
