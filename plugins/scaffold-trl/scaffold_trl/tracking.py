"""Tracking sinks (``trainer.report_to``): TensorBoard, trackio and W&B, through the Trainer's own callbacks.

Each sink is the Hugging Face Trainer's integration (``report_to`` of its
arguments): the Trainer's log of every step goes to it, and scaffold's
per-step metrics are merged into that log before it is sent (``grpo.py``),
so scaffold's figures (``reward_mean``, ``groups_filtered``,
``eval_reward_mean``, ...) and TRL's (``loss``, ``entropy``, ...) land in the
same run. Everything stays on this machine by default:

* ``tensorboard``: event files under ``<run>/tensorboard`` (unless
  ``TENSORBOARD_LOGGING_DIR`` is set);
* ``trackio``: trackio's local store (``$TRACKIO_DIR``, by default
  ``~/.cache/huggingface/trackio``), project ``scaffold``, run named after the
  run directory; nothing is uploaded unless a Space is configured;
* ``wandb``: offline mode (``WANDB_MODE=offline`` unless set), files under
  ``<run>/wandb`` (unless ``WANDB_DIR`` is set); ``wandb sync`` uploads them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

#: sink -> (the module it needs, the extra that installs it).
SINKS = {"tensorboard": ("tensorboard", "tensorboard"), "trackio": ("trackio", "trackio"),
         "wandb": ("wandb", "wandb")}


def check_sinks(sinks: list[str]) -> list[str]:
    """The sinks, each once; ValueError in one line naming the extra to install for a missing package."""
    for sink in sinks:
        module, extra = SINKS[sink]
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"report_to: {sink} needs the {module} package, which is not installed: "
                             f"pip install 'scaffold-trl[{extra}]'")
    return list(dict.fromkeys(sinks))


def prepare_environment(sinks: list[str], output_dir: Path) -> None:
    """Settings the sinks read from the environment, before the Trainer builds them (the user's win)."""
    if "wandb" in sinks:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", str(output_dir))


def place_tensorboard(trainer: Any, output_dir: Path) -> None:
    """Point the Trainer's TensorBoard callback at ``<run>/tensorboard`` (unless the user chose a folder)."""
    if os.environ.get("TENSORBOARD_LOGGING_DIR"):
        return
    for callback in trainer.callback_handler.callbacks:
        if type(callback).__name__ == "TensorBoardCallback" and getattr(callback, "logging_dir", None) is None:
            callback.logging_dir = str(output_dir / "tensorboard")


def finish(sinks: list[str]) -> None:
    """Close what the Trainer's callbacks leave open at the end of training (W&B's run: it would otherwise
    print its closing lines on stdout when the process exits)."""
    if "wandb" in sinks:
        import wandb

        if wandb.run is not None:
            wandb.finish()
