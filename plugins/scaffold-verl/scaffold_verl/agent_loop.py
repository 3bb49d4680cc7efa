"""``ScaffoldAgentLoop``: verl's agent loop running any scaffold controller (imports verl).

Select it with an agent loop config file (``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: scaffold_agent
      _target_: scaffold_verl.agent_loop.ScaffoldAgentLoop
      controller: {name: majority_vote, samples: 4}
      verifier: gsm8k

and ``actor_rollout_ref.rollout.agent.default_agent_loop=scaffold_agent`` (or an
``agent_name`` column). Importing this module also registers the loop as
``scaffold_agent`` in verl's registry of the importing process. See
:class:`scaffold_verl.loop.ScaffoldLoop` for the options. Importing it
without verl installed raises :class:`~scaffold_core.errors.MissingDependencyError`
naming the install command.
"""

from __future__ import annotations

from .api import load_api
from .loop import ScaffoldLoop

VERL = load_api()


@VERL.register("scaffold_agent")
class ScaffoldAgentLoop(ScaffoldLoop, VERL.AgentLoopBase):  # type: ignore[name-defined]
    """verl's ``AgentLoopBase``: ``run(sampling_params, **kwargs)`` runs one scaffold episode."""

    verl = VERL
