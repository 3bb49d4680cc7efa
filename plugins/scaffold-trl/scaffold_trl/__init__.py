"""scaffold-trl: GRPO with TRL's GRPOTrainer on scaffold's rollouts (``trainer: {name: trl}``).

Importing this module is cheap: TRL loads inside ``TRLTrainer.train``.
"""

from __future__ import annotations

from scaffold_core import hookimpl

from .trainer import GRPORun, TRLTrainer

__all__ = ["GRPORun", "TRLTrainer"]


@hookimpl
def register_trainers(registry):
    registry.add("trl", TRLTrainer)
