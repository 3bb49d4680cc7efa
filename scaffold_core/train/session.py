"""``scaffold train``: run the configured trainer with a progress bar, per-step metrics and its rollouts on file.

Files in the run directory: ``config.yaml`` (the resolved config),
``train_metrics.jsonl`` (one line per optimizer step, appended as steps
finish: what the run computed), ``train_timings.jsonl`` (the same steps'
clock readings), ``train_summary.json`` (what the trainer returned, at the
end), the rollouts of every step (the store ``episodes.db``, and at the end
``samples.jsonl``, ``failures.jsonl``, ``trajectories/`` and ``metrics.json``,
as ``scaffold run`` writes them: :mod:`scaffold_core.train.step_ledger`), and
whatever the trainer writes (its checkpoints).

``resume=True`` continues the run in the directory: the config must match
the saved one (as ``scaffold run --resume``; ``force_config`` continues
anyway and records the change), and the trainer picks up from its last
checkpoint, calling ``job.rewind`` so that the steps it runs again are
recorded once.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ..errors import ConfigError, ScaffoldError
from ..output.files import atomic_write_text
from ..output.reader import TRAIN_METRICS as METRICS_FILE
from ..output.reader import TRAIN_SUMMARY as SUMMARY_FILE
from ..output.reader import TRAIN_TIMINGS as TIMINGS_FILE
from ..output.saved_config import CONFIG_FILE, check_resume_config, record_forced_change
from ..trainer import STEP_METRICS, TrainJob, TrainStep, is_timing
from .step_ledger import StepLedger

#: The files ``scaffold train`` itself writes (a fresh run removes them; the store's are the run output's).
TRAIN_FILES = (METRICS_FILE, TIMINGS_FILE, SUMMARY_FILE)


def train_output_dir(config: Any, output: str | None) -> Path:
    """``-o DIR``, else ``output.dir`` with ``{task}``, ``{controller}``, ``{time}`` expanded."""
    if output is not None:
        return Path(output)
    from ..output import expand_output_dir

    return Path(expand_output_dir(config))


def prepare_dir(directory: Path, overwrite: bool) -> None:
    """Create the run directory for a fresh run; refuse one holding an earlier training run unless ``overwrite``."""
    if (directory / METRICS_FILE).exists() and not overwrite:
        raise ConfigError(f"{directory} already holds a training run ({METRICS_FILE}); continue it with --resume, "
                          "choose another -o directory, or pass --overwrite to replace it")
    directory.mkdir(parents=True, exist_ok=True)
    for name in TRAIN_FILES:
        (directory / name).unlink(missing_ok=True)


def check_resume(directory: Path, config: Any, force_config: bool) -> dict[str, tuple[Any, Any]]:
    """Refuse to resume a directory that holds no training run, or one whose saved config differs."""
    if not (directory / CONFIG_FILE).is_file():
        raise ConfigError(f"--resume: {directory} holds no training run to continue (no {CONFIG_FILE}); start one "
                          "without --resume")
    return check_resume_config(directory, config, force=force_config, command="train")


def format_step(step: TrainStep) -> str:
    """``step 3/20  reward_mean=0.4375  loss=0.0123  version=2  stale_dropped=0  ...``"""
    total = f"/{step.max_steps}" if step.max_steps else ""
    extra = ("skipped", "groups_filtered", "eval_reward_mean", "step_time_s", "rollout_s")
    shown = [k for k in STEP_METRICS if k in step.metrics] + [k for k in extra if k in step.metrics]
    parts = [f"{k}={_number(step.metrics[k])}" for k in shown]
    if step.checkpoint:
        parts.append(f"checkpoint={step.checkpoint}")
    return f"step {step.step}{total}  " + "  ".join(parts)


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _keep_steps(path: Path, last: int) -> None:
    """Rewrite a per-step file keeping the lines of steps up to ``last`` (atomically)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue  # a torn last line
        if isinstance(step, int) and step <= last:
            kept.append(line + "\n")
    atomic_write_text(path, "".join(kept))


class StepReporter:
    """Receives each :class:`TrainStep`: moves the bar, prints the line, appends it to the metrics files."""

    def __init__(self, directory: Path, *, progress: bool | None = None, stream: TextIO | None = None):
        from tqdm import tqdm

        self.path = directory / METRICS_FILE
        self.timings_path = directory / TIMINGS_FILE
        self.stream = stream or sys.stderr
        self.steps: list[TrainStep] = []
        self.bar = tqdm(total=None, unit="step", desc="training", dynamic_ncols=True, file=self.stream,
                        disable=(None if progress is None else not progress), leave=True)
        self.started = time.perf_counter()
        self.first_step = 0  # the step a resumed run continues after (its rate counts this session's steps)

    def __call__(self, step: TrainStep) -> None:
        self.steps.append(step)
        record = step.to_dict()
        computed = {k: v for k, v in record.items() if not is_timing(k)}
        clocks = {"step": step.step, **{k: v for k, v in record.items() if is_timing(k)},
                  "wall_s": round(time.perf_counter() - self.started, 3)}
        for path, values in ((self.path, computed), (self.timings_path, clocks)):
            with path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(values, default=str) + "\n")
        if step.max_steps and self.bar.total != step.max_steps:
            self.bar.total = step.max_steps
        self.bar.update(step.step - self.bar.n)
        reward = step.metrics.get("reward_mean")
        if isinstance(reward, (int, float)):
            self.bar.set_postfix_str(f"reward={reward:.3f}", refresh=False)
        self.bar.write(format_step(step) + self._timing(step), file=self.stream)

    def _timing(self, step: TrainStep) -> str:
        """``  elapsed 1:02  eta 3:10``: the time so far and, from the steps' rate, the time left."""
        from ..run.progress import clock_text

        elapsed = time.perf_counter() - self.started
        done = step.step - self.first_step
        left = (elapsed / done * (step.max_steps - step.step)) if step.max_steps and done > 0 else None
        return f"  elapsed {clock_text(elapsed)}  eta {clock_text(left)}"

    def rewind(self, last: int) -> None:
        """Forget the steps after ``last`` (a resumed run runs them again)."""
        for path in (self.path, self.timings_path):
            _keep_steps(path, last)
        self.bar.n = last
        self.first_step = last

    def close(self) -> None:
        self.bar.close()


def require_trainer(config: Any, registry: Any) -> None:
    """Fail in one line when the config has no ``trainer`` section, naming the installed trainers."""
    if config.trainer is None:
        names = ", ".join(registry.names("trainer")) or "none installed (docs/plugins.md lists the trainer plugins)"
        raise ConfigError(f"{config.source or '<config>'}: trainer: `scaffold train` needs a trainer section, "
                          f"trainer: {{name: NAME}}; installed trainers: {names}")


def run_training(config: Any, output_dir: Path, *, registry: Any = None, progress: bool | None = None,
                 overwrite: bool = False, resume: bool = False, force_config: bool = False,
                 stream: TextIO | None = None) -> dict[str, Any]:
    """Build the configured trainer, run it, and write the metrics, rollouts and summary files.

    Returns the summary. ``resume``: continue the training run in ``output_dir`` (see the module doc).
    """
    if registry is None:
        from ..plugins import get_registry

        registry = get_registry()
    require_trainer(config, registry)
    trainer = registry.create("trainer", config.trainer.name, config.trainer.options, path="trainer")
    private = bool(getattr(config.output, "private", True))
    if resume:
        changes = check_resume(output_dir, config, force_config)
        (output_dir / SUMMARY_FILE).unlink(missing_ok=True)
    else:
        changes = {}
        prepare_dir(output_dir, overwrite)
    ledger = StepLedger(output_dir, resume=resume, overwrite=overwrite and not resume, private=private)
    try:
        if changes:
            record_forced_change(output_dir, changes, private=private)
        atomic_write_text(output_dir / CONFIG_FILE, config.to_yaml(), private=private)
        from ..run.provenance import write_provenance

        write_provenance(output_dir, config.to_dict(), registry=registry, private=private)
        summary = _train(trainer, config, output_dir, ledger, registry, resume=resume, progress=progress,
                         stream=stream)
    finally:
        ledger.close()
    atomic_write_text(output_dir / SUMMARY_FILE, json.dumps(summary, indent=2, default=str) + "\n")
    nothing = trained_nothing(summary)
    if nothing:
        raise ScaffoldError(f"{output_dir}: {nothing}")
    return summary


def trained_nothing(summary: dict[str, Any]) -> str | None:
    """Why a finished training run changed no weight (a trainer that reports ``optimizer_steps`` 0), else None:
    such a run is a failure, never a success (its rollouts and summary are on disk all the same)."""
    if summary.get("optimizer_steps") != 0:
        return None
    steps = summary.get("steps", 0)
    why = (f"all {steps} step(s) were skipped: no prompt group had samples with different rewards (GRPO learns "
           "nothing from a group whose rewards are equal; see train_metrics.jsonl)" if steps
           else "no step ran (the trainer drew no batch from the task's rows)")
    return f"the run trained nothing: {why}; its rollouts and summary are kept"


def _train(trainer: Any, config: Any, output_dir: Path, ledger: StepLedger, registry: Any, *, resume: bool,
           progress: bool | None, stream: TextIO | None) -> dict[str, Any]:
    reporter = StepReporter(output_dir, progress=progress, stream=stream)

    def rewind(step: int, state: dict[str, Any] | None) -> None:
        reporter.rewind(step)
        ledger.rewind((state or {}).get("ledger"))

    job = TrainJob(config=config, output_dir=output_dir, report=reporter, registry=registry, ledger=ledger,
                   resume=resume, rewind=rewind, checkpoint_state=lambda: {"ledger": ledger.state()})
    started = time.perf_counter()
    try:
        summary = dict(trainer.train(job) or {})
    finally:
        reporter.close()
    summary.setdefault("steps", len(reporter.steps))
    if ledger.steps_written or ledger.episodes():
        rollout = [s.metrics.get("rollout_s") for s in reporter.steps]
        rollout_s = sum(v for v in rollout if isinstance(v, (int, float)) and not isinstance(v, bool))
        metrics = ledger.finish(save_dataset=bool(getattr(config.output, "save_dataset", True)),
                                save_parquet=bool(getattr(config.output, "save_parquet", False)),
                                rollout_s=rollout_s or None)
        summary["rollouts_on_disk"] = {k: metrics.get(k) for k in ("episodes", "samples", "failed")}
    summary["wall_s"] = round(time.perf_counter() - started, 3)
    return summary
