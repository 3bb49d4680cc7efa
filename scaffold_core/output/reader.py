"""Reading a finished run directory: the one place code outside ``output/`` reads a run's files from.

``scaffold eval`` and ``scaffold report`` read episodes, metrics, the saved
config, evaluation figures and training steps through these functions only,
never by parsing the files themselves, so a change in how the ledger is
encoded on disk is made here and in :mod:`.ledger` alone.

* :func:`run_kind`: ``"eval"``, ``"train"`` or ``"run"``, from the files present;
* :func:`read_json` / :func:`read_config`: ``metrics.json``, ``eval.json``,
  ``train_summary.json`` and the saved ``config.yaml``;
* :func:`read_train_steps`: the per-step lines of ``train_metrics.jsonl``;
* :class:`EpisodeReader`: every episode's latest record, as light heads
  (no token lists) in ``(index, episode_id)`` order, and whole records by
  position, in bounded memory (a :class:`~.ledger_index.LedgerIndex`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import RunDirError
from . import codec
from .files import open_nofollow
from .ledger import latest_records, ledger_paths
from .ledger_index import LedgerChanged, LedgerIndex
from .saved_config import CONFIG_FILE

#: ``scaffold eval``'s figures, next to the run's own files.
EVAL_FILE = "eval.json"
#: The offline HTML report ``scaffold report`` (and the end of ``run``, ``eval`` and ``train``) writes.
REPORT_FILE = "report.html"
#: ``scaffold train``: one line per optimizer step, appended as steps finish.
TRAIN_METRICS = "train_metrics.jsonl"
#: ``scaffold train``: the clock readings of each step (``wall_s``, ``rollout_s``, ...), apart so that
#: ``train_metrics.jsonl`` holds only what the run computed.
TRAIN_TIMINGS = "train_timings.jsonl"
#: ``scaffold train``: what the trainer returned, at the end.
TRAIN_SUMMARY = "train_summary.json"
METRICS_FILE = "metrics.json"


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes, None when absent; a link is refused (RunDirError), never followed."""
    if not os.path.lexists(path):
        return None
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as fh:
        return fh.read()


def run_kind(directory: str | Path) -> str:
    """``"eval"`` (an ``eval.json``), ``"train"`` (training steps or summary) or ``"run"`` (an episode ledger).

    Raises RunDirError naming the directory when it holds none of them.
    """
    root = Path(directory)
    if not root.is_dir():
        raise RunDirError(f"{root}: no such run directory; give the folder a `scaffold run`, `eval` or `train` "
                          "wrote (its -o DIR)", path=str(root))
    if os.path.lexists(root / EVAL_FILE):
        return "eval"
    if os.path.lexists(root / TRAIN_METRICS) or os.path.lexists(root / TRAIN_SUMMARY):
        return "train"
    if ledger_paths(root) or os.path.lexists(root / METRICS_FILE):
        return "run"
    raise RunDirError(f"{root}: not a run directory (no episodes.jsonl, {EVAL_FILE} or {TRAIN_METRICS}); give the "
                      "folder a `scaffold run`, `eval` or `train` wrote (its -o DIR)", path=str(root))


def read_json(directory: str | Path, name: str) -> dict[str, Any] | None:
    """A run's JSON file (``metrics.json``, ``eval.json``, ``train_summary.json``), None when absent.

    A file that is not a JSON object is a RunDirError naming it.
    """
    path = Path(directory) / name
    raw = _read_bytes(path)
    if raw is None:
        return None
    try:
        data = codec.loads(raw)
    except ValueError as exc:
        raise RunDirError(f"{path}: not valid JSON ({exc}); the run that wrote it may have been killed while "
                          "writing it: run the command again", path=str(path)) from None
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: expected a JSON object, got {type(data).__name__}", path=str(path))
    return data


def read_config(directory: str | Path) -> tuple[str, dict[str, Any]] | None:
    """The saved ``config.yaml``: (its text, its data), or None when the run saved none."""
    import yaml

    path = Path(directory) / CONFIG_FILE
    raw = _read_bytes(path)
    if raw is None:
        return None
    text = raw.decode("utf-8", errors="replace")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RunDirError(f"{path}: not valid YAML ({exc})", path=str(path)) from None
    return text, data if isinstance(data, dict) else {}


def read_train_steps(directory: str | Path) -> list[dict[str, Any]]:
    """The per-step metrics of a training run, in order, each with its step's clock readings from
    ``train_timings.jsonl``; a torn or unreadable line is skipped."""
    steps = _step_lines(Path(directory) / TRAIN_METRICS)
    timings = {t["step"]: t for t in _step_lines(Path(directory) / TRAIN_TIMINGS)}
    return [{**step, **{k: v for k, v in timings.get(step["step"], {}).items() if k not in step}} for step in steps]


def _step_lines(path: Path) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for line in (_read_bytes(path) or b"").splitlines():
        try:
            step = json.loads(line)
        except ValueError:
            continue
        if isinstance(step, dict) and isinstance(step.get("step"), int):
            steps.append(step)
    return steps


class EpisodeReader:
    """Every episode's latest record in a run directory, in ``(index, episode_id)`` order.

    :meth:`heads` streams the records without their ``trajectories`` (cheap:
    the token lists are not parsed); :meth:`record` reads one whole record by
    its position in that order. Memory stays small however long the run: the
    records are located, not loaded. Use as a context manager (it holds the
    ledgers open).
    """

    def __init__(self, directory: str | Path, on_head: Callable[[dict[str, Any]], None] | None = None, *,
                 index: LedgerIndex | None = None):
        """``on_head``: given every ledger line's record without its trajectories, in ledger order, as the
        ledgers are indexed (see :meth:`line_order`). ``index``: the directory's ledgers indexed already
        (completed; by the run that wrote them, see :class:`~.ledger_index.LedgerIndex`'s ``scan``): they are
        not read again, and ``on_head`` is not called."""
        self.directory = Path(directory)
        self._index: LedgerIndex | None = index if index is not None else LedgerIndex(ledger_paths(self.directory),
                                                                                      on_head)
        self._records: list[dict[str, Any]] | None = None
        if not self._index.exact:  # a ledger the index cannot describe: every record in memory
            self._in_memory()

    def _in_memory(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None
        records = latest_records(ledger_paths(self.directory))
        self._records = sorted(records.values(), key=lambda r: (r.get("index", 0), r["episode_id"]))

    def __len__(self) -> int:
        return len(self._records) if self._records is not None else len(self._index or ())

    def heads(self) -> Iterator[dict[str, Any]]:
        """Every episode's record without ``trajectories``."""
        done = 0
        if self._index is not None:
            try:
                for head in self._index.heads():
                    yield head
                    done += 1
                return
            except LedgerChanged:  # the ledger changed under us: read it whole, from where this stopped
                self._in_memory()
        for record in (self._records or [])[done:]:
            yield {k: v for k, v in record.items() if k != "trajectories"}

    def line_order(self) -> list[int] | None:
        """The heads ``on_head`` was given, as :meth:`heads` orders them: position by position, the number of
        the head (0 for the first given) that is the episode's record; None when that is not so (an episode
        with several records, a ledger read whole instead), and the heads must be read with :meth:`heads`."""
        return self._index.line_order() if self._index is not None else None

    def record(self, position: int) -> dict[str, Any]:
        """The whole record (trajectories included) of the episode at ``position`` in :meth:`heads`' order."""
        if self._index is not None:
            try:
                return self._index.record(position)
            except LedgerChanged:
                self._in_memory()
        assert self._records is not None
        return self._records[position]

    def close(self) -> None:
        if self._index is not None:
            self._index.close()

    def __enter__(self) -> EpisodeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
