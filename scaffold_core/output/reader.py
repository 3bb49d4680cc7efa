"""Reading a finished run directory: the one place code outside ``output/`` reads a run's files from.

``scaffold eval`` and ``scaffold report`` read episodes, metrics, the saved
config, evaluation figures and training steps through these functions only,
never by parsing the files themselves, so a change in how the store is
kept on disk is made here and in :mod:`.store` alone.

* :func:`run_kind`: ``"eval"``, ``"train"`` or ``"run"``, from the files present;
* :func:`read_json` / :func:`read_config`: ``metrics.json``, ``eval.json``,
  ``train_summary.json`` and the saved ``config.yaml``;
* :func:`read_train_steps`: the per-step lines of ``train_metrics.jsonl``;
* :class:`EpisodeReader`: every episode's record, as light heads (no
  training sequences) in ``(index, episode_id)`` order, and whole records by
  position, in bounded memory (read from the run's store, :mod:`.store`).
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import RunDirError
from . import codec
from .files import open_nofollow
from .saved_config import CONFIG_FILE
from .store import STORE, StoreReader, ordered_rows, store_errors, store_paths

#: ``scaffold eval``'s figures, next to the run's own files.
EVAL_FILE = "eval.json"
#: The offline HTML report ``scaffold report`` (and the end of ``run``, ``eval`` and ``train``) writes.
REPORT_FILE = "report.html"
#: Beside the report: every episode's spans in Chrome's trace event format (Perfetto, chrome://tracing).
TRACE_FILE = "trace.json"
#: ``scaffold train``: one line per optimizer step, appended as steps finish.
TRAIN_METRICS = "train_metrics.jsonl"
#: ``scaffold train``: the clock readings of each step (``wall_s``, ``rollout_s``, ...), apart so that
#: ``train_metrics.jsonl`` holds only what the run computed.
TRAIN_TIMINGS = "train_timings.jsonl"
#: ``scaffold train``: what the trainer returned, at the end.
TRAIN_SUMMARY = "train_summary.json"
METRICS_FILE = "metrics.json"
#: What produced the run (model, weights fingerprint, tokenizer, engine, seed, versions): every run, eval and
#: train directory has one (:mod:`scaffold_core.run.provenance`).
PROVENANCE_FILE = "provenance.json"


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes, None when absent; a link is refused (RunDirError), never followed."""
    if not os.path.lexists(path):
        return None
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as fh:
        return fh.read()


def run_kind(directory: str | Path) -> str:
    """``"eval"`` (an ``eval.json``), ``"train"`` (training steps or summary) or ``"run"`` (an episode store).

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
    if store_paths(root) or os.path.lexists(root / METRICS_FILE):
        return "run"
    raise RunDirError(f"{root}: not a run directory (no {STORE}, {EVAL_FILE} or {TRAIN_METRICS}); give the "
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
    """Every episode's record in a run directory, in ``(index, episode_id)`` order.

    :meth:`heads` streams the records without their ``trajectories`` (cheap:
    the training sequences are not read); :meth:`record` reads one whole
    record by its position in that order. Memory stays small however long the
    run: a few bytes per episode. Use as a context manager.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.paths = store_paths(self.directory)
        self._places: array[int] | None = None  # per position: the episode's row in its store
        self._stores: array[int] | None = None  # per position: the number of that store in ``paths``
        self._readers: dict[int, StoreReader] = {}

    def __len__(self) -> int:
        if self._places is None:
            self._locate()
        assert self._places is not None
        return len(self._places)

    def heads(self) -> Iterator[dict[str, Any]]:
        """Every episode's record without ``trajectories``."""
        places, stores = array("q"), array("h")
        for seq, head, *_, store in ordered_rows(self.paths, columns="seq, CAST(head AS BLOB)"):
            places.append(seq)
            stores.append(store)
            yield codec.loads(head)
        self._places, self._stores = places, stores

    def _locate(self) -> None:
        """Where each episode's row is, in order, without reading the records (the store's index only)."""
        places, stores = array("q"), array("h")
        if len(self.paths) == 1:  # the index holds each row's seq: read without the rows (a covering scan)
            with store_errors(self.paths[0]):
                places.extend(seq for (seq,) in self._reader(0).db.execute(
                    "SELECT seq FROM episodes ORDER BY idx, episode_id"))
            stores.frombytes(bytes(stores.itemsize * len(places)))
        else:
            for seq, *_, store in ordered_rows(self.paths, columns="seq"):
                places.append(seq)
                stores.append(store)
        self._places, self._stores = places, stores

    def record(self, position: int) -> dict[str, Any]:
        """The whole record (trajectories included) of the episode at ``position`` in :meth:`heads`' order."""
        if self._places is None:
            self._locate()
        assert self._places is not None and self._stores is not None
        return self._reader(self._stores[position]).record(self._places[position])

    def _reader(self, number: int) -> StoreReader:
        if number not in self._readers:
            self._readers[number] = StoreReader(self.paths[number])
        return self._readers[number]

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def __enter__(self) -> EpisodeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
