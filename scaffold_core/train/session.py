"""``scaffold train``: run the configured trainer with a progress bar and per-step metrics on file.

Files in the run directory: ``config.yaml`` (the resolved config),
``train_metrics.jsonl`` (one line per optimizer step, appended as steps
finish), ``train_summary.json`` (what the trainer returned, at the end), and
whatever the trainer writes (its checkpoints).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ..errors import ConfigError
from ..output.files import atomic_write_text
from ..output.reader import TRAIN_METRICS as METRICS_FILE
from ..output.reader import TRAIN_SUMMARY as SUMMARY_FILE
from ..trainer import STEP_METRICS, TrainJob, TrainStep


def train_output_dir(config: Any, output: str | None) -> Path:
    """``-o DIR``, else ``output.dir`` with ``{task}``, ``{controller}``, ``{time}`` expanded."""
    if output is not None:
        return Path(output)
    from ..output import expand_output_dir

    return Path(expand_output_dir(config))


def prepare_dir(directory: Path, overwrite: bool) -> None:
    """Create the run directory; refuse one holding an earlier training run unless ``overwrite``."""
    if (directory / METRICS_FILE).exists() and not overwrite:
        raise ConfigError(f"{directory} already holds a training run ({METRICS_FILE}); choose another -o "
                          "directory, or pass --overwrite to replace it")
    directory.mkdir(parents=True, exist_ok=True)
    for name in (METRICS_FILE, SUMMARY_FILE):
        (directory / name).unlink(missing_ok=True)


def format_step(step: TrainStep) -> str:
    """``step 3/20  reward_mean=0.4375  loss=0.0123  version=2  stale_dropped=0  ...``"""
    total = f"/{step.max_steps}" if step.max_steps else ""
    shown = [k for k in STEP_METRICS if k in step.metrics] + sorted(
        k for k in step.metrics if k not in STEP_METRICS and k in ("step_time_s", "rollout_s"))
    parts = [f"{k}={_number(step.metrics[k])}" for k in shown]
    if step.checkpoint:
        parts.append(f"checkpoint={step.checkpoint}")
    return f"step {step.step}{total}  " + "  ".join(parts)


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class StepReporter:
    """Receives each :class:`TrainStep`: moves the bar, prints the line, appends it to the metrics file."""

    def __init__(self, directory: Path, *, progress: bool | None = None, stream: TextIO | None = None):
        from tqdm import tqdm

        self.path = directory / METRICS_FILE
        self.stream = stream or sys.stderr
        self.steps: list[TrainStep] = []
        self.bar = tqdm(total=None, unit="step", desc="training", dynamic_ncols=True, file=self.stream,
                        disable=(None if progress is None else not progress), leave=True)
        self.started = time.perf_counter()

    def __call__(self, step: TrainStep) -> None:
        self.steps.append(step)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({**step.to_dict(), "wall_s": round(time.perf_counter() - self.started, 3)},
                               default=str) + "\n")
        if step.max_steps and self.bar.total != step.max_steps:
            self.bar.total = step.max_steps
        self.bar.update(step.step - self.bar.n)
        reward = step.metrics.get("reward_mean")
        if isinstance(reward, (int, float)):
            self.bar.set_postfix_str(f"reward={reward:.3f}", refresh=False)
        self.bar.write(format_step(step), file=self.stream)

    def close(self) -> None:
        self.bar.close()


def require_trainer(config: Any, registry: Any) -> None:
    """Fail in one line when the config has no ``trainer`` section, naming the installed trainers."""
    if config.trainer is None:
        names = ", ".join(registry.names("trainer")) or "none installed (pip install scaffold-trl)"
        raise ConfigError(f"{config.source or '<config>'}: trainer: `scaffold train` needs a trainer section, "
                          f"e.g. trainer: {{name: trl}}; installed trainers: {names}")


def run_training(config: Any, output_dir: Path, *, registry: Any = None, progress: bool | None = None,
                 overwrite: bool = False, stream: TextIO | None = None) -> dict[str, Any]:
    """Build the configured trainer, run it, and write the metrics and summary files. Returns the summary."""
    if registry is None:
        from ..plugins import get_registry

        registry = get_registry()
    require_trainer(config, registry)
    trainer = registry.create("trainer", config.trainer.name, config.trainer.options, path="trainer")
    prepare_dir(output_dir, overwrite)
    atomic_write_text(output_dir / "config.yaml", config.to_yaml())
    reporter = StepReporter(output_dir, progress=progress, stream=stream)
    started = time.perf_counter()
    try:
        summary = dict(trainer.train(TrainJob(config=config, output_dir=output_dir, report=reporter,
                                              registry=registry)) or {})
    finally:
        reporter.close()
    summary.setdefault("steps", len(reporter.steps))
    summary["wall_s"] = round(time.perf_counter() - started, 3)
    atomic_write_text(output_dir / SUMMARY_FILE, json.dumps(summary, indent=2, default=str) + "\n")
    return summary
