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
train`` writes to ``train_summary.json``. A summary whose ``optimizer_steps``
is 0 (no step changed a weight: none ran, or every one was skipped) fails the
run after it is written: a run that trained nothing never looks like a success.
Factories must be cheap: import
the training library inside ``train``.

What else ``scaffold train`` hands a trainer:

* ``job.ledger``: a :class:`~scaffold_core.train.step_ledger.StepLedger`;
  the trainer writes each step's rollouts to it (``write_step``), so the run
  directory keeps them in the store and dataset form of ``scaffold run``.
* ``job.resume``: continue the run in ``output_dir`` from its last
  checkpoint. The trainer saves ``job.checkpoint_state()`` with every
  checkpoint, and before its first new step calls ``job.rewind(step, state)``
  with the checkpoint's step and that state (``0, None`` when it starts
  over): the metrics and the store are cut back to that step, so a step run
  again is recorded once.

Metrics whose name ends in ``_s`` are clock readings (seconds): they go to
``train_timings.jsonl``, so that ``train_metrics.jsonl`` holds only what the
run computed and two runs with the same seed can be compared byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The per-step metric names ``scaffold train`` shows on every step line (others are kept in the file).
STEP_METRICS = ("reward_mean", "loss", "version", "stale_dropped")


def is_timing(name: str) -> bool:
    """Whether a step metric is a clock reading (seconds: ``wall_s``, ``rollout_s``, ...)."""
    return name.endswith("_s")


@dataclass
class TrainStep:
    """One optimizer step's report.

    ``step`` counts from 1; ``max_steps`` is the planned total (``None`` if
    unknown). ``metrics`` holds at least ``reward_mean`` (mean reward of the
    step's rollouts), ``loss`` (absent on a step that took no optimizer step),
    ``version`` (the weight version the step's rollouts were generated with)
    and ``stale_dropped`` (samples dropped as stale so far), plus whatever
    else the trainer measures. ``checkpoint`` is the directory saved at this
    step, if any.
    """

    step: int
    max_steps: int | None
    metrics: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "max_steps": self.max_steps, **self.metrics,
                **({"checkpoint": self.checkpoint} if self.checkpoint else {})}


def _no_rewind(step: int, state: dict[str, Any] | None) -> None:
    return None


@dataclass
class TrainJob:
    """What a trainer gets: the resolved config, where to write, how to report steps, the registry; the
    ledger for its rollouts, whether to resume, and what a checkpoint keeps for that (see the module doc)."""

    config: Any
    output_dir: Path
    report: Callable[[TrainStep], None] = lambda step: None
    registry: Any = None
    ledger: Any = None
    resume: bool = False
    rewind: Callable[[int, dict[str, Any] | None], None] = _no_rewind
    checkpoint_state: Callable[[], dict[str, Any]] = dict


class Trainer:
    """Base class of trainers (``register_trainers``)."""

    def train(self, job: TrainJob) -> dict[str, Any]:  # pragma: no cover - interface
        """Train; call ``job.report`` once per optimizer step; return a summary dict."""
        raise NotImplementedError
