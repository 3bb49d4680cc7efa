"""A run's output directory: what it holds, preparing it (fresh, resumed, overwritten), appending episodes.

Files (see docs/reliability.md for the guarantees):

* ``episodes.jsonl``: the ledger. One line per finished episode (completed or
  failed), appended with a single ``write`` as the episode finishes, holding
  its samples and training sequences. A killed run loses at most the episodes
  in flight; ``--resume`` skips every completed episode found here.
* ``samples.jsonl``: one line per sample: prompt, response, reference answer
  (``answer``), extracted answer, reward, finish reason. ``scaffold score``
  can re-score it as is.
* ``failures.jsonl``: one line per failed episode with the component and reason.
* ``trajectories/``: the training sequences as a Hugging Face dataset
  (``datasets.load_from_disk(dir + "/trajectories")``).
* ``metrics.json`` and ``config.yaml``: written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..episode import EpisodeResult
from ..errors import ConfigError
from .files import atomic_write_text, safe_child
from .ledger import LEDGER, RANK_LEDGER_GLOB, completed_ids, ledger_line, ledger_paths

#: Files and folders a run writes; ``overwrite`` removes only these (and rank ledgers), never anything else.
RUN_FILES = (LEDGER, "samples.jsonl", "failures.jsonl", "trajectories", "metrics.json", "config.yaml", "workers")


def expand_output_dir(config: Any) -> Path:
    """``output.dir`` with ``{task}``, ``{controller}`` and ``{time}`` filled in."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = config.output.dir.format(task=config.task.name, controller=config.controller.name, time=stamp)
    return Path(text)


def run_files(directory: str | Path) -> list[str]:
    """Names of the run files present in ``directory``."""
    root = Path(directory)
    names = [name for name in RUN_FILES if (root / name).exists()]
    return names + [p.name for p in sorted(root.glob(RANK_LEDGER_GLOB))]


class RunOutput:
    """Owns one output directory for one process."""

    def __init__(self, directory: str | Path, *, resume: bool = False, overwrite: bool = False,
                 ledger_name: str = LEDGER, prepared: bool = False):
        """``prepared=True``: a launcher already checked (and, if asked, emptied) the directory for
        this process, one of several workers writing into it; only the own ledger is opened."""
        self.dir = Path(directory)
        self.resume = resume
        self.ledger_path = safe_child(self.dir, ledger_name)
        self._fd: int | None = None
        if prepared:
            self.dir.mkdir(parents=True, exist_ok=True)
        else:
            self.prepare(overwrite)

    def prepare(self, overwrite: bool) -> None:
        existing = run_files(self.dir)
        if existing and not self.resume and not overwrite:
            raise ConfigError(
                f"output.dir: {self.dir} already holds a run ({', '.join(existing)}). Continue it with "
                f"--resume, replace it with --set output.overwrite=true, or choose another directory with -o")
        if self.resume and not ledger_paths(self.dir) and not overwrite:
            raise ConfigError(f"--resume: {self.dir} has no {LEDGER} (or {RANK_LEDGER_GLOB}) to resume from")
        if overwrite and not self.resume:
            for name in existing:
                target = self.dir / name
                shutil.rmtree(target) if target.is_dir() else target.unlink()
        self.dir.mkdir(parents=True, exist_ok=True)

    def completed_ids(self) -> set[str]:
        """Ids of completed episodes in every ledger of the directory (a run may be resumed with a
        different number of workers), when resuming."""
        if not self.resume:
            return set()
        self._repair_ledger()
        paths = ledger_paths(self.dir)
        if self.ledger_path.exists() and self.ledger_path not in [p.resolve() for p in paths]:
            paths.append(self.ledger_path)
        return completed_ids(paths)

    def _repair_ledger(self) -> None:
        """Cut a torn last line so new appends start on a line of their own."""
        if not self.ledger_path.exists():
            return
        with self.ledger_path.open("r+b") as fh:
            end = fh.seek(0, os.SEEK_END)
            cut = end
            while cut > 0:  # back from the end, a block at a time, to the last newline (the ledger is not read whole)
                start = max(0, cut - (1 << 16))
                fh.seek(start)
                block = fh.read(cut - start)
                if cut == end and block.endswith(b"\n"):
                    return
                newline = block.rfind(b"\n")
                if newline >= 0:
                    cut = start + newline + 1
                    break
                cut = start
            if cut < end:
                fh.truncate(cut)

    def open(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.ledger_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, result: EpisodeResult) -> None:
        """Persist one finished episode with a single append."""
        if self._fd is None:
            self.open()
        os.write(self._fd, ledger_line(result))  # type: ignore[arg-type]

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None

    def write_config(self, config: Any) -> None:
        atomic_write_text(self.dir / "config.yaml", config.to_yaml())

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        write_metrics(self.dir, metrics)


def write_metrics(directory: Path, metrics: dict[str, Any]) -> None:
    """``metrics.json``, written atomically."""
    atomic_write_text(directory / "metrics.json", json.dumps(metrics, indent=2, sort_keys=False) + "\n")
