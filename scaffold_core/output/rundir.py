"""A run's output directory: what it holds, preparing it (fresh, resumed, overwritten), recording episodes.

Files (see docs/reliability.md for the guarantees):

* ``episodes.db``: the run's store (:mod:`scaffold_core.output.store`), an SQLite database with one row per
  finished episode (completed or failed) holding its samples and training sequences. A run records the
  episodes that finish in one step of its event loop in one transaction at the end of that step
  (:attr:`RunOutput.deferred`): a killed run loses at most the episodes in flight (those of the step being
  written included); ``--resume`` skips every completed episode found here.
* ``samples.jsonl``, ``failures.jsonl``, ``trajectories/`` and ``trajectories.parquet``: exported from the
  store (:mod:`scaffold_core.output.export`), as the run goes or at its end.
* ``metrics.json`` and ``config.yaml``: written atomically (temp file + rename).
* ``config-history.jsonl``: the config changes a ``--force-config`` resume continued with.
* ``eval.json`` (``scaffold eval``'s figures) and ``report.html`` (the offline report), written at the end.
* ``.scaffold.lock``: the lock the run holds while it runs (one run per directory).

No file is written through a symbolic link (see :mod:`scaffold_core.output.files`); files are 0600
and folders 0700 unless ``output.private`` is false.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .._meta import bare_name
from ..episode import EpisodeResult
from ..errors import ConfigError, RunDirError
from .export import DATASET, FAILURES, PARQUET, SAMPLES
from .files import atomic_write_text, dir_mode, refuse_link, remove_stale_temps, safe_child
from .lock import LOCK_FILE, RunLock
from .reader import EVAL_FILE, PROVENANCE_FILE, REPORT_FILE
from .saved_config import CONFIG_FILE, CONFIG_HISTORY, check_resume_config, record_forced_change
from .store import RANK_STORE_GLOB, SIDE_SUFFIXES, STORE, EpisodeStore, completed_ids, count_episodes, store_paths

#: Files and folders a run writes; ``overwrite`` removes only these (and the workers' stores and the stores'
#: side files), never anything else.
RUN_FILES = (STORE, SAMPLES, FAILURES, DATASET, PARQUET, "metrics.json", CONFIG_FILE, "workers", CONFIG_HISTORY,
             EVAL_FILE, REPORT_FILE, PROVENANCE_FILE)
#: The run files that are folders.
FOLDERS = (DATASET, "workers")
#: The ledger of scaffold versions before the store (a JSON line per episode).
OLD_LEDGER = "episodes.jsonl"


def expand_output_dir(config: Any) -> Path:
    """``output.dir`` with ``{task}``, ``{controller}`` and ``{time}`` filled in."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = config.output.dir.format(task=bare_name(config.task.name), controller=bare_name(config.controller.name),
                                   time=stamp)
    return Path(text)


def run_files(directory: str | Path) -> list[str]:
    """Names of the run files present in ``directory`` (links included): the workers' stores and the stores'
    side files too."""
    root = Path(directory)
    names = [name for name in RUN_FILES if os.path.lexists(root / name)]
    stores = [STORE, *(p.name for p in sorted(root.glob(RANK_STORE_GLOB)))]
    sides = [name + s for name in stores for s in SIDE_SUFFIXES if os.path.lexists(root / (name + s))]
    return names + stores[1:] + sides


def has_episodes(directory: str | Path) -> bool:
    """Whether any episode was recorded in ``directory``; a run that failed before its first episode left none."""
    root = Path(directory)
    if any(os.path.lexists(p) and os.lstat(p).st_size > 0 for p in (root / SAMPLES, root / FAILURES)):
        return True
    return any(count_episodes(p) for p in store_paths(root) if not p.is_symlink())


def refuse_links(directory: Path) -> None:
    """RunDirError for any file the run writes (run files, workers' stores, worker logs) that is a link, and
    for a folder where the run keeps a file."""
    for name in run_files(directory):
        refuse_link(directory / name)
        if name not in FOLDERS and (directory / name).is_dir():
            raise RunDirError(f"{directory / name} is a folder where scaffold keeps a file; move it away, or choose "
                              "another output directory with -o", path=str(directory / name))
    workers = directory / "workers"
    if workers.is_dir():
        for entry in os.scandir(workers):
            refuse_link(entry.path)


class RunOutput:
    """Owns one output directory for one process."""

    def __init__(self, directory: str | Path, *, resume: bool = False, overwrite: bool = False,
                 store_name: str = STORE, prepared: bool = False, config: Any = None, force_config: bool = False,
                 private: bool | None = None):
        """``prepared=True``: a launcher already checked (and, if asked, emptied) the directory for
        this process, one of several workers writing into it; only the own store is opened.

        Otherwise this process owns the run: it takes the directory's lock (held until :meth:`release`),
        refuses links and an existing run (unless resuming or overwriting), and, when resuming with
        ``config``, refuses a config that differs from the saved one unless ``force_config``.
        """
        self.dir = Path(directory)
        self.resume = resume
        if resume and overwrite and not prepared:
            raise ConfigError(f"--resume continues the run in {self.dir} and --overwrite (output.overwrite: true) "
                              "replaces it: pass one (--set output.overwrite=false to resume a config that "
                              "overwrites)")
        if private is None:
            private = bool(getattr(getattr(config, "output", None), "private", True))
        self.private = private
        self.store_path = safe_child(self.dir, store_name)
        self.store: EpisodeStore | None = None
        #: While True, :meth:`append` keeps episodes in memory until :meth:`flush` (or :meth:`close`) records
        #: them in one transaction: a run flushes at the end of each step of its event loop.
        self.deferred = False
        self._pending: list[EpisodeResult] = []
        self._failed: BaseException | None = None  # a write that failed: nothing more is appended
        self.lock: RunLock | None = None
        self.forced_changes: dict[str, tuple[Any, Any]] = {}
        self._touched = False
        self.dir.mkdir(mode=dir_mode(private), parents=True, exist_ok=True)
        if not self.dir.is_dir():
            raise RunDirError(f"output.dir: {self.dir} is not a folder; choose another directory with -o",
                              path=str(self.dir))
        if prepared:
            return
        self._touched = os.path.lexists(self.dir / LOCK_FILE)  # an earlier start (which may have failed) was here
        self.lock = RunLock(self.dir, private=private).acquire()
        try:
            self.prepare(overwrite, config=config, force_config=force_config)
        except BaseException:
            self.release()
            raise

    def prepare(self, overwrite: bool, *, config: Any = None, force_config: bool = False) -> None:
        refuse_links(self.dir)
        existing = run_files(self.dir)
        if self.resume and os.path.lexists(self.dir / OLD_LEDGER) and not os.path.lexists(self.store_path):
            raise RunDirError(f"--resume: {self.dir} holds a run of an earlier scaffold version ({OLD_LEDGER}, "
                              f"not {STORE}); finish it with that version, or start this run in another directory "
                              "with -o", path=str(self.dir / OLD_LEDGER))
        started = has_episodes(self.dir)
        if started and not self.resume and not overwrite:
            raise ConfigError(
                f"output.dir: {self.dir} already holds a run ({', '.join(existing)}). Continue it with "
                f"--resume, replace it with --set output.overwrite=true, or choose another directory with -o")
        if self.resume and not existing and not overwrite and not self._touched:
            raise ConfigError(f"--resume: {self.dir} has no {STORE} (or {RANK_STORE_GLOB}) to resume from")
        if overwrite and not self.resume:
            for name in existing:
                target = self.dir / name
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
        remove_stale_temps(self.dir, RUN_FILES)
        if self.resume and started and config is not None:
            # A directory whose earlier start failed before its first episode is fresh: nothing to compare.
            self.forced_changes = check_resume_config(self.dir, config, force=force_config)

    def release(self) -> None:
        """Release the directory's lock (the run is over)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def completed_ids(self) -> set[str]:
        """Ids of completed episodes in every store of the directory (a run may be resumed with a different
        number of workers), when resuming."""
        if not self.resume:
            return set()
        return completed_ids(store_paths(self.dir))

    def open(self) -> None:
        if self.store is None:
            self.store = EpisodeStore(self.store_path, private=self.private)

    def append(self, result: EpisodeResult) -> None:
        """Record one finished episode (while :attr:`deferred`, with the others at the next :meth:`flush`)."""
        if self._failed is not None:
            raise RunDirError(f"{self.store_path}: an earlier write failed ({type(self._failed).__name__}: "
                              f"{self._failed}); nothing more is recorded. Fix its cause (a full disk, a file "
                              "system gone), then --resume the run", path=str(self.store_path))
        self._pending.append(result)
        if not self.deferred:
            self.flush()

    def flush(self) -> None:
        """Record the episodes appended since the last flush, in one transaction. A write that fails raises;
        what it held is not recorded (its episodes run again on resume)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        try:
            self.open()
            assert self.store is not None
            self.store.put(pending)
        except BaseException as exc:
            self._failed = exc
            raise

    def close(self) -> None:
        """Record what is deferred, then close the store."""
        try:
            if self._failed is None:
                self.flush()
        finally:
            self._pending = []
            if self.store is not None:
                self.store.close()
                self.store = None

    def write_config(self, config: Any) -> None:
        """Save the run's config (and record a change a --force-config resume continued with)."""
        if self.forced_changes:
            record_forced_change(self.dir, self.forced_changes, private=self.private)
            self.forced_changes = {}
        atomic_write_text(self.dir / CONFIG_FILE, config.to_yaml(), private=self.private)

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        write_metrics(self.dir, metrics, private=self.private)


def write_metrics(directory: Path, metrics: dict[str, Any], *, private: bool = True) -> None:
    """``metrics.json``, written atomically."""
    atomic_write_text(directory / "metrics.json", json.dumps(metrics, indent=2, sort_keys=False) + "\n",
                      private=private)
