"""A run's output directory: what it holds, preparing it (fresh, resumed, overwritten), appending episodes.

Files (see docs/reliability.md for the guarantees):

* ``episodes.jsonl``: the ledger. One line per finished episode (completed or
  failed), appended as the episode finishes, holding its samples and training
  sequences; their token arrays are packed in ``episodes.tokens.bin``,
  appended just before the line (see :mod:`scaffold_core.output.tokens`). A
  run's episodes that finish in one step of its event loop are appended
  together at the end of that step (:attr:`RunOutput.deferred`): one ``write``
  for their blobs, then one for their lines. A killed run loses at most the
  episodes in flight (those of the step being written included); ``--resume``
  skips every completed episode found here.
* ``samples.jsonl``: one line per sample: prompt, response, reference answer
  (``answer``), extracted answer, reward, finish reason. ``scaffold score``
  can re-score it as is.
* ``failures.jsonl``: one line per failed episode with the component and reason.
* ``trajectories/``: the training sequences as a Hugging Face dataset
  (``datasets.load_from_disk(dir + "/trajectories")``).
* ``metrics.json`` and ``config.yaml``: written atomically (temp file + rename).
* ``.derived.*``: while the run goes, the derived files of its records (:mod:`.live`), put in place at
  the end (:mod:`.join`).
* ``config-history.jsonl``: the config changes a ``--force-config`` resume continued with.
* ``eval.json`` (``scaffold eval``'s figures) and ``report.html`` (the offline report), written at the end.
* ``.scaffold.lock``: the lock the run holds while it runs (one run per directory).

No file is written through a symbolic link (see :mod:`scaffold_core.output.files`); files are 0600
and folders 0700 unless ``output.private`` is false.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._meta import bare_name
from ..episode import EpisodeResult
from ..errors import ConfigError, RunDirError
from .files import (
    atomic_write_text,
    dir_mode,
    open_append,
    open_nofollow,
    refuse_link,
    remove_stale_temps,
    safe_child,
    write_all,
)
from .follower import LedgerFollower
from .ledger import LEDGER, RANK_LEDGER_GLOB, completed_ids, ledger_paths, packed_entry
from .live import PART_NAME, LivePart
from .lock import LOCK_FILE, RunLock
from .reader import EVAL_FILE, REPORT_FILE
from .reserve import Reservation
from .saved_config import CONFIG_FILE, CONFIG_HISTORY, check_resume_config, record_forced_change
from .tokens import tokens_name, tokens_path

log = logging.getLogger("scaffold.output")

#: Files and folders a run writes; ``overwrite`` removes only these (and rank ledgers and their sidecars),
#: never anything else.
RUN_FILES = (LEDGER, tokens_name(LEDGER), "samples.jsonl", "failures.jsonl", "trajectories", "metrics.json",
             CONFIG_FILE, "workers", CONFIG_HISTORY, EVAL_FILE, REPORT_FILE)
#: The sidecars of rank ledgers.
RANK_TOKENS_GLOB = tokens_name(RANK_LEDGER_GLOB)
#: The run files that are folders.
FOLDERS = ("trajectories", "workers")
#: Files that hold episodes: while every one is missing or empty, no episode has run in the directory yet.
EPISODE_FILES = (LEDGER, "samples.jsonl", "failures.jsonl")


def expand_output_dir(config: Any) -> Path:
    """``output.dir`` with ``{task}``, ``{controller}`` and ``{time}`` filled in."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = config.output.dir.format(task=bare_name(config.task.name), controller=bare_name(config.controller.name),
                                   time=stamp)
    return Path(text)


def run_files(directory: str | Path) -> list[str]:
    """Names of the run files present in ``directory`` (links included)."""
    root = Path(directory)
    names = [name for name in RUN_FILES if os.path.lexists(root / name)]
    return names + [p.name for p in sorted(root.glob(RANK_LEDGER_GLOB))] + \
        [p.name for p in sorted(root.glob(RANK_TOKENS_GLOB))]


def has_episodes(directory: str | Path) -> bool:
    """Whether any episode was recorded in ``directory``; a run that failed before its first episode left none."""
    root = Path(directory)
    paths = [root / name for name in EPISODE_FILES] + sorted(root.glob(RANK_LEDGER_GLOB))
    return any(os.path.lexists(p) and os.lstat(p).st_size > 0 for p in paths)


def refuse_links(directory: Path) -> None:
    """RunDirError for any file the run writes (run files, rank ledgers, worker logs) that is a link, and
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
                 ledger_name: str = LEDGER, prepared: bool = False, config: Any = None, force_config: bool = False,
                 private: bool | None = None):
        """``prepared=True``: a launcher already checked (and, if asked, emptied) the directory for
        this process, one of several workers writing into it; only the own ledger is opened.

        Otherwise this process owns the run: it takes the directory's lock (held until :meth:`release`),
        refuses links and an existing run (unless resuming or overwriting), and, when resuming with
        ``config``, refuses a config that differs from the saved one unless ``force_config``.
        """
        self.dir = Path(directory)
        self.resume = resume
        if private is None:
            private = bool(getattr(getattr(config, "output", None), "private", True))
        self.private = private
        self.ledger_path = safe_child(self.dir, ledger_name)
        self.tokens_path = tokens_path(self.ledger_path)
        self._fd: int | None = None
        self._tokens_fd: int | None = None
        self._room = self._tokens_room = Reservation(None)  # disk blocks reserved ahead of the ledger's appends
        self._start = self._size = self._tokens_size = 0
        self._named_end = 0  # resuming: the end of the furthest blob of the sidecar a line of the ledger names
        #: While True, :meth:`append` keeps lines and blobs in memory until :meth:`flush` (or :meth:`close`)
        #: writes them, with one ``write`` per file: a run flushes at the end of each step of its event loop.
        self.deferred = False
        self._lines: list[bytes] = []  # appended, not written yet (deferred)
        self._blobs: list[bytes] = []
        self._failed: BaseException | None = None  # a write that failed: nothing more is appended
        self.live: LivePart | None = None
        self.follower: LedgerFollower | None = None  # writes the live part in a process of its own
        #: Called with each record appended, the offset of its line in the ledger and the line's size (e.g.
        #: a report's :class:`~scaffold_core.report.tally.RunTally`); one that raises is dropped.
        self.on_append: Callable[[dict[str, Any], int, int], None] | None = None
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
        started = has_episodes(self.dir)
        if started and not self.resume and not overwrite:
            raise ConfigError(
                f"output.dir: {self.dir} already holds a run ({', '.join(existing)}). Continue it with "
                f"--resume, replace it with --set output.overwrite=true, or choose another directory with -o")
        if self.resume and not existing and not overwrite and not self._touched:
            raise ConfigError(f"--resume: {self.dir} has no {LEDGER} (or {RANK_LEDGER_GLOB}) to resume from")
        if overwrite and not self.resume:
            for name in existing:
                target = self.dir / name
                shutil.rmtree(target) if target.is_dir() else target.unlink()
        remove_stale_temps(self.dir, [*RUN_FILES, PART_NAME, *(p.name for p in self.dir.glob(RANK_LEDGER_GLOB))])
        if self.resume and started and config is not None:
            # A directory whose earlier start failed before its first episode is fresh: nothing to compare.
            self.forced_changes = check_resume_config(self.dir, config, force=force_config)

    def release(self) -> None:
        """Release the directory's lock (the run is over)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def completed_ids(self) -> set[str]:
        """Ids of completed episodes in every ledger of the directory (a run may be resumed with a
        different number of workers), when resuming."""
        if not self.resume:
            return set()
        self._repair_ledger()
        paths = ledger_paths(self.dir)
        if self.ledger_path.exists() and self.ledger_path not in [p.resolve() for p in paths]:
            paths.append(self.ledger_path)
        bad: dict[Path, list[int]] = {}
        named: dict[Path, int] = {}
        done = completed_ids(paths, bad, named)
        own = self.ledger_path.resolve()
        self._named_end = max((end for path, end in named.items() if path.resolve() == own), default=0)
        for path, numbers in bad.items():
            if numbers:
                more = f" and {len(numbers) - 10} more" if len(numbers) > 10 else ""
                shown = ", ".join(map(str, numbers[:10])) + more
                print(f"scaffold: WARNING: {path}: lines {shown} are not episode records (skipped; their episodes "
                      "run again)", file=sys.stderr)
        return done

    def _repair_ledger(self) -> None:
        """Cut a torn last line so new appends start on a line of their own."""
        if not os.path.lexists(self.ledger_path):
            return
        fd = open_nofollow(self.ledger_path, os.O_RDWR)
        with os.fdopen(fd, "r+b") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return
            tail_start = max(0, size - (1 << 20))
            while True:  # find the last newline, reading backwards in blocks
                fh.seek(tail_start)
                block = fh.read(size - tail_start)
                cut = block.rfind(b"\n")
                if cut >= 0 or tail_start == 0:
                    break
                tail_start = max(0, tail_start - (1 << 20))
            if cut + tail_start + 1 < size:
                fh.truncate(tail_start + cut + 1)

    def open(self) -> None:
        if self._fd is None:
            self._tokens_fd = open_append(self.tokens_path, private=self.private)
            self._tokens_size = os.fstat(self._tokens_fd).st_size
            if self._tokens_size < self._named_end:
                # A sidecar cut short (or lost) under lines that name blobs past its end: new blobs go after
                # every blob named, never where an old line would find bytes that check again.
                os.ftruncate(self._tokens_fd, self._named_end)
                self._tokens_size = self._named_end
            self._fd = open_append(self.ledger_path, private=self.private)
            self._start = self._size = os.fstat(self._fd).st_size
            self._tokens_room = Reservation(self.tokens_path, at=self._tokens_size)
            self._room = Reservation(self.ledger_path, at=self._size)

    def start_live(self, save_dataset: bool, *, first: int = 0, step: int = 1, follow: bool = False) -> None:
        """Write this session's derived files as its episodes finish (:mod:`.live`; ``first``, ``step``: the
        indices of its episodes, in the order they start), when its ledger starts empty (a resumed session's
        files are derived from the ledgers at the end). ``follow``: in a process of its own that reads the
        ledger back as it is written (:mod:`.follower`), else in this one."""
        self.open()
        if self._start != 0 or self.live is not None or self.follower is not None:
            return
        if follow:
            try:
                self.follower = LedgerFollower(self.dir, self.ledger_path, save_dataset, start=self._start,
                                               private=self.private, first=first, step=step)
                return
            except OSError as exc:
                log.warning("starting a process to write the derived files failed (%s: %s); this one writes them",
                            type(exc).__name__, exc)
        self.live = LivePart(self.dir, save_dataset, private=self.private, first=first, step=step)

    def append(self, result: EpisodeResult) -> None:
        """Persist one finished episode: its token arrays to the sidecar, then its line with a single append
        (while :attr:`deferred`, with the other episodes' at the next :meth:`flush`)."""
        if self._failed is not None:
            raise RunDirError(f"{self.ledger_path}: an earlier write failed ({type(self._failed).__name__}: "
                              f"{self._failed}); nothing more is appended. Fix its cause (a full disk, a file "
                              "system gone), then --resume the run", path=str(self.ledger_path))
        if self._fd is None:
            self.open()
        line, blob, record = packed_entry(result, self._tokens_size)
        if blob:
            self._tokens_size += len(blob)
            self._blobs.append(blob)
        offset = self._size
        self._size += len(line)
        self._lines.append(line)
        if not self.deferred:
            self.flush()
        if self.on_append is not None:
            try:
                self.on_append(record, offset, len(line))
            except Exception as exc:  # an observer only: the episode is in the ledger
                log.warning("an observer of the ledger failed (%s: %s); it sees no more episodes",
                            type(exc).__name__, exc)
                self.on_append = None
        if self.live is not None:
            try:
                self.live.add(record, blob)
            except Exception as exc:  # the ledger has the episode: the files are derived from it at the end
                log.warning("writing the derived files as the run goes failed (%s: %s); they are derived from "
                            "the ledger at the end", type(exc).__name__, exc)
                self.drop_live()

    def flush(self) -> None:
        """Write the lines appended since the last flush (their blobs first, then the lines: a line is never
        in the ledger before its blob is in the sidecar). A write that fails raises; what it held is not
        recorded (its episodes run again on resume)."""
        blobs, lines = self._blobs, self._lines
        if not lines:
            return
        self._blobs, self._lines = [], []
        try:
            if blobs:
                self._tokens_room.ensure(self._tokens_size)
                write_all(self._tokens_fd, blobs[0] if len(blobs) == 1 else b"".join(blobs))  # type: ignore[arg-type]
            self._room.ensure(self._size)
            write_all(self._fd, lines[0] if len(lines) == 1 else b"".join(lines))  # type: ignore[arg-type]
        except BaseException as exc:
            self._failed = exc  # the files' ends are no longer where the next line would say
            raise
        if self.follower is not None:
            try:
                self.follower.wrote(self._size)
            except OSError as exc:  # it died: the ledger has everything
                log.warning("the process writing the derived files stopped (%s: %s); they are derived from the "
                            "ledger at the end", type(exc).__name__, exc)
                self.drop_live()

    def finish_live(self, metrics: dict[str, Any] | None) -> Path | None:
        """Complete this session's derived files (``metrics``: the totals of its episodes); their folder, or
        None when there are none."""
        live, self.live = self.live, None
        follower, self.follower = self.follower, None
        try:
            if follower is not None:
                return follower.finish(end=self._size, metrics=metrics)
            if live is not None:
                return live.finish(ledger=self.ledger_path.name, start=self._start, end=self._size, metrics=metrics)
        except Exception as exc:
            log.warning("completing the derived files written as the run went failed (%s: %s); they are derived "
                        "from the ledger", type(exc).__name__, exc)
            for part in (follower, live):
                if part is not None:
                    part.abort()
        return None

    def drop_live(self) -> None:
        """Give up the derived files written as the run went (the ledger has everything)."""
        live, self.live = self.live, None
        follower, self.follower = self.follower, None
        if live is not None:
            live.abort()
        if follower is not None:
            follower.abort()

    def close(self) -> None:
        """Write what is deferred, then close the ledger and its sidecar (synced to disk)."""
        try:
            if self._fd is not None:
                self.flush()
        finally:
            self._tokens_room.close()
            self._room.close()
            for name in ("_tokens_fd", "_fd"):
                fd = getattr(self, name)
                if fd is not None:
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                        setattr(self, name, None)

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
