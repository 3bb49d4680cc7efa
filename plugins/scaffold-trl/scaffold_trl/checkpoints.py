"""What a checkpoint keeps for ``scaffold train --resume``, and finding the last complete one.

TRL's Trainer saves a checkpoint as ``checkpoint-N/``: the model, optimizer,
scheduler, RNG states and ``trainer_state.json`` (the step counter and the
log history); ``resume_from_checkpoint`` restores all of them. scaffold adds
``scaffold_state.json``, written (atomically) before the Trainer writes its
files: the step, what ``scaffold train`` needs to rewind its metrics and
ledger (``job.checkpoint_state()``), and the trainer's own counters.

A checkpoint is complete when both ``scaffold_state.json`` and
``trainer_state.json`` read back and name the same step: the Trainer writes
``trainer_state.json`` after everything else, so a run killed while saving
leaves an incomplete folder, which a resume removes and never loads.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

STATE_FILE = "scaffold_state.json"
TRAINER_STATE = "trainer_state.json"
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_dirs(directory: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``checkpoint-N`` folder in ``directory``, by step."""
    found = []
    for path in directory.iterdir() if directory.is_dir() else ():
        match = CHECKPOINT.match(path.name)
        if match and path.is_dir() and not path.is_symlink():
            found.append((int(match.group(1)), path))
    return sorted(found)


def write_state(folder: Path, state: dict[str, Any]) -> None:
    """``folder/scaffold_state.json``, written to a temp file and renamed into place."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{STATE_FILE}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / STATE_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_state(folder: Path, step: int) -> dict[str, Any] | None:
    """The scaffold state of a complete checkpoint at ``step``, else None."""
    state, trainer = _read(folder / STATE_FILE), _read(folder / TRAINER_STATE)
    if state is None or trainer is None or state.get("step") != step or trainer.get("global_step") != step:
        return None
    return state


def last_complete(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The last complete checkpoint in ``directory`` and its scaffold state; incomplete folders after it
    (a save cut short) are removed."""
    found = None
    for step, folder in reversed(checkpoint_dirs(directory)):
        state = read_state(folder, step)
        if state is not None:
            found = (folder, state)
            break
        shutil.rmtree(folder)
    return found


def remove_all(directory: Path) -> list[str]:
    """Remove every ``checkpoint-N`` folder (a fresh run in a directory an earlier run used); their names."""
    names = []
    for _, folder in checkpoint_dirs(directory):
        shutil.rmtree(folder)
        names.append(folder.name)
    return names
