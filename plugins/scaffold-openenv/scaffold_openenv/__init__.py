"""scaffold-openenv: OpenEnv environments (``openenv-core``) that run locally, as scaffold episodes.

Components (hookimpls only; the logic lives in sibling modules):

* controller ``openenv`` (:class:`scaffold_openenv.controller.OpenEnvController`): one instance of an OpenEnv
  ``Environment`` per episode, in this process; the model's turns are its actions, its observations are
  environment tokens (loss mask 0, version -1), its rewards are the episode's.

``openenv`` is imported only when an episode makes its environment.
"""

from __future__ import annotations

from scaffold_core import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_controllers(registry):
    from .controller import OpenEnvController

    registry.add("openenv", OpenEnvController)
