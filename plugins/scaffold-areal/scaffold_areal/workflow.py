"""``ScaffoldWorkflow``: AReaL's ``RolloutWorkflow`` running any scaffold controller (imports AReaL).

Select it in an AReaL training script::

    trainer.train(workflow="scaffold_areal.workflow.ScaffoldWorkflow",
                  workflow_kwargs=dict(controller="majority_vote", verifier="gsm8k",
                                       gconfig=config.gconfig, tokenizer=config.tokenizer_path))

See :class:`scaffold_areal.rollout.ScaffoldRollout` for the options and the
rejection policy. Importing this module without AReaL installed raises
:class:`~scaffold_core.errors.MissingDependencyError` naming the install command.
"""

from __future__ import annotations

from .api import load_api
from .rollout import ScaffoldRollout

AREAL = load_api()


class ScaffoldWorkflow(ScaffoldRollout, AREAL.RolloutWorkflow):  # type: ignore[name-defined]
    """AReaL's ``RolloutWorkflow``: ``arun_episode(engine, data)`` runs one scaffold episode."""

    areal = AREAL
