"""scaffold-areal: run any scaffold controller inside AReaL's rollout workers.

AReaL selects a workflow by import path in the training script::

    trainer.train(workflow="scaffold_areal.workflow.ScaffoldWorkflow",
                  workflow_kwargs=dict(controller="majority_vote", verifier="gsm8k",
                                       gconfig=config.gconfig, tokenizer=config.tokenizer_path))

Modules:

* :mod:`scaffold_areal.workflow`: ``ScaffoldWorkflow``, AReaL's ``RolloutWorkflow`` (imports AReaL)
* :mod:`scaffold_areal.rollout`: what ``arun_episode`` does (no AReaL import), with the core's
  ``TrainingRollouts``, staleness policy and AReaL tensor dicts (``scaffold_core.train``)
* :mod:`scaffold_areal.engine`: scaffold's engine contract over ``InferenceEngine.agenerate``
  (the weight version of every generated token included)
* :mod:`scaffold_areal.samples`: which samples of an episode AReaL trains on

The plugin registers no components: AReaL drives it, not ``scaffold run``.
AReaL itself is never a dependency: ``pip install "scaffold-areal[areal]"``.
"""

from __future__ import annotations

__version__ = "0.1.0"
