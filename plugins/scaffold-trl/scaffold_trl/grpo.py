"""TRL's GRPOTrainer with scaffold's hooks, and the callback that reports each step.

Three of GRPOTrainer's own methods are extended, each by a few lines:

* ``_generate_and_score_completions``: once TRL has computed the step's
  advantages, the step's rollouts go to the ledger with them;
* ``log``: scaffold's per-step metrics join the Trainer's log before it is
  sent anywhere, so every tracking sink (and ``trainer_state.json``'s log
  history) gets them together with TRL's; on a skipped step the figures of an
  optimizer step that did not happen (``loss``, ``grad_norm``, TRL's series
  with no value) are left out;
* ``_save_checkpoint``: ``scaffold_state.json`` is written into the
  checkpoint before the Trainer's files (see ``checkpoints.py``), as TRL
  itself adds its entropy controller's state;
* ``_get_train_sampler``: TRL's sampler, seeded again at every epoch from
  the seed and the epoch's number. TRL's own draws each epoch's order from
  one generator, so a run resumed in a later epoch (the Trainer does not
  replay the epochs before it) would see other prompts than the run it
  continues; seeded per epoch, it sees the same ones.

A step with no informative group *skips* the optimizer step: its batch is
padding only, and :class:`ScaffoldSteps` clears every gradient
(``set_to_none``) just before ``optimizer.step()``, so AdamW, which steps only
parameters that have a gradient, changes no weight and no moment. The step
counter, the learning-rate schedule and the checkpoint cadence still count
the step (``max_steps`` counts steps taken or skipped).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from scaffold_core.sampling import derive_seed
from scaffold_core.trainer import TrainStep

from .checkpoints import write_state
from .distill import distill_advantages, top_k_loss

#: TRL's log keys reported with each step (renamed where scaffold has its own name).
TRL_KEYS = {"loss": "loss", "grad_norm": "grad_norm", "entropy": "entropy", "learning_rate": "learning_rate",
            "reward_std": "reward_std", "step_time": "step_time_s", "kl": "kl",
            "clip_ratio/region_mean": "clip_ratio", "completions/mean_length": "completion_length",
            "completions/clipped_ratio": "completions_truncated", "opd_top_k_loss": "opd_top_k_loss"}
#: Figures of an optimizer step: not reported for a skipped one.
STEP_ONLY = ("loss", "grad_norm", "entropy", "kl", "clip_ratio/region_mean", "opd_top_k_loss")


class QuietPadding(logging.Filter):
    """Drops TRL's warning that every reward function returned None when the row is scaffold's padding
    (``scaffold_group`` empty): padding has no reward on purpose. TRL may prefix its messages (``[RANK 0]``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("All reward functions returned None" in message and "'scaffold_group': ''" in message)


def quiet_padding() -> None:
    """Install :class:`QuietPadding` on TRL's GRPO logger (once)."""
    logger = logging.getLogger("trl.trainer.grpo_trainer")
    if not any(isinstance(f, QuietPadding) for f in logger.filters):
        logger.addFilter(QuietPadding())


def make_trainer(run: Any, **kwargs: Any) -> Any:
    """A GRPOTrainer (built with ``kwargs``) whose rollouts, logs and checkpoints go through ``run``."""
    quiet_padding()
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler

    class EpochSeededSampler(RepeatSampler):
        """TRL's sampler whose order in epoch ``e`` depends on the seed and ``e`` only (accelerate's data loader
        calls ``set_epoch`` before each epoch)."""

        def set_epoch(self, epoch: int) -> None:
            if self.shuffle and self.seed is not None:
                self.generator.manual_seed(derive_seed(self.seed, "epoch", epoch))

    class ScaffoldGRPOTrainer(GRPOTrainer):
        def _get_train_sampler(self, dataset: Any = None) -> Any:
            s: Any = super()._get_train_sampler(dataset)
            return EpochSeededSampler(data_source=s.data_source, mini_repeat_count=s.mini_repeat_count,
                                      batch_size=s.batch_size, repeat_count=s.repeat_count, shuffle=s.shuffle,
                                      seed=s.seed)

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            output = super()._generate_and_score_completions(inputs)
            teacher_rows = None
            if run.teacher is not None:
                run.distill_figures, teacher_rows = distill_advantages(
                    run.teacher, run.loop, output, run.options.mix, run.options.rollout_timeout,
                    top_k=run.teacher.top_k if run.options.opd_top_k_weight > 0 else 0)
            if getattr(self.model, "training", False):
                advantages = output["advantages"]
                if advantages.dim() == 2:  # per token: each sample's mean over its completion tokens
                    mask = output["completion_mask"].to(advantages.dtype)
                    advantages = (advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
                run.bridge.trained([float(a) for a in advantages.reshape(-1).tolist()], teacher_rows)
            return output

        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            weight = run.options.opd_top_k_weight
            if weight > 0 and inputs.get("teacher_top_k_ids") is not None:
                import torch

                completion = inputs["completion_ids"]
                ids = torch.cat([inputs["prompt_ids"], completion], dim=1)
                attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
                # only the completion positions' logits (a full (B, T, V) float tensor per forward is large)
                logits = model(input_ids=ids, attention_mask=attention,
                               logits_to_keep=completion.size(1) + 1).logits[:, :-1, :]
                mask = inputs["completion_mask"]
                if inputs.get("tool_mask") is not None:
                    mask = mask * inputs["tool_mask"]
                term = top_k_loss(logits, inputs["teacher_top_k_ids"], inputs["teacher_top_k_logps"], mask)
                self._metrics["train"]["opd_top_k_loss"].append(float(term.detach()))
                loss = loss + weight * term / self.current_gradient_accumulation_steps
            return loss

        def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
            if getattr(self.model, "training", False) and "loss" in logs:
                run.step_log(logs, self._metrics["train"])
            super().log(logs, start_time)

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            step = int(self.state.global_step)
            write_state(Path(self._get_output_dir(trial=trial)) / f"checkpoint-{step}", run.checkpoint_state(step))
            super()._save_checkpoint(model, trial)

    return ScaffoldGRPOTrainer(**kwargs)


def drop_skipped_figures(logs: dict[str, Any], series: dict[str, list[float]]) -> None:
    """Leave out of a skipped step's log what only an optimizer step measures, and TRL's series that hold
    no value (padding has none: they would be sent as ``None``)."""
    for key in STEP_ONLY:
        logs.pop(key, None)
    for key in [k for k, values in series.items() if all(isinstance(v, float) and math.isnan(v) for v in values)]:
        del series[key]


def step_report(logs: dict[str, Any], state: Any, checkpoint: bool) -> TrainStep:
    """The :class:`TrainStep` of one training log (scaffold's metrics already merged into it)."""
    metrics = {name: logs[key] for key, name in TRL_KEYS.items() if logs.get(key) is not None}
    metrics.update({k: v for k, v in logs.items() if k in SCAFFOLD_KEYS or k.startswith("eval_")})
    return TrainStep(int(state.global_step), int(state.max_steps) or None, metrics,
                     f"checkpoint-{state.global_step}" if checkpoint else None)


#: The per-step metrics scaffold adds to the Trainer's log (see ``GRPORun.step_log``).
SCAFFOLD_KEYS = ("reward_mean", "version", "stale_dropped", "stale_regenerated", "groups_used", "groups_filtered",
                 "refill_rounds", "skipped", "steps_skipped", "samples", "completions", "generated_tokens",
                 "rollout_s", "teacher_kl", "teacher_kl_max_sample", "teacher_calls", "teacher_samples",
                 "teacher_tokens", "teacher_scored_tokens", "teacher_s")


def callbacks(run: Any) -> Any:
    """The TrainerCallback that syncs weights, skips, evaluates and reports each step for ``run``."""
    from transformers import TrainerCallback

    class ScaffoldSteps(TrainerCallback):
        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            latest = run.bridge.latest if run.bridge is not None else None
            if latest is not None and latest.skipped:
                run.model.zero_grad(set_to_none=True)  # AdamW steps only parameters with a gradient
                run.steps_skipped += 1

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if run.bridge is not None and run.trainer is not None:
                run.bridge.sync_weights(run.trainer)  # the engine serves the new weights from here on
                run.maybe_evaluate(int(state.global_step))

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            if logs and "steps_skipped" in logs:  # a training step's log (not the end-of-training summary)
                run.job.report(step_report(logs, state, bool(control.should_save)))

    return ScaffoldSteps()
