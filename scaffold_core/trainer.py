"""The trainer contract: what ``scaffold train`` runs.

A trainer plugin registers a factory with ``register_trainers``; the
config's ``trainer:`` section selects it by ``name`` and its other keys are
the factory's options (validated before anything loads, like every
component). ``scaffold train`` then calls :meth:`Trainer.train` once with a
:class:`TrainJob`: the resolved config (the trainer builds its rollouts
from it, usually with :class:`scaffold_core.train.prompt_groups.TrainingRollouts`),
the run directory, and :meth:`TrainJob.report`, which the trainer calls once
per optimizer step with a :class:`TrainStep`. The core draws the progress
bar, prints the step's metrics and appends them to ``train_metrics.jsonl``.

A trainer writes its checkpoints under ``job.output_dir`` and returns a
summary dict (final metrics, where the checkpoints are), which ``scaffold
train`` writes to ``train_summary.json``. Factories must be cheap: import
the training library inside ``train``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The per-step metric names ``scaffold train`` shows on every step line (others are kept in the file).
STEP_METRICS = ("reward_mean", "loss", "version", "stale_dropped")


@dataclass
class TrainStep:
    """One optimizer step's report.

    ``step`` counts from 1; ``max_steps`` is the planned total (``None`` if
    unknown). ``metrics`` holds at least ``reward_mean`` (mean reward of the
    step's rollouts), ``loss``, ``version`` (the weight version the step's
    rollouts were generated with) and ``stale_dropped`` (samples dropped as
    stale so far), plus whatever else the trainer measures. ``checkpoint`` is
    the directory saved at this step, if any.
    """

    step: int
    max_steps: int | None
    metrics: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "max_steps": self.max_steps, **self.metrics,
                **({"checkpoint": self.checkpoint} if self.checkpoint else {})}


@dataclass
class TrainJob:
    """What a trainer gets: the resolved config, where to write, how to report steps, the registry."""

    config: Any
    output_dir: Path
    report: Callable[[TrainStep], None] = lambda step: None
    registry: Any = None


class Trainer:
    """Base class of trainers (``register_trainers``)."""

    def train(self, job: TrainJob) -> dict[str, Any]:  # pragma: no cover - interface
        """Train; call ``job.report`` once per optimizer step; return a summary dict."""
        raise NotImplementedError
