"""Files derived from the episodes' records: samples, failures and the trajectories dataset.

They are written a record at a time, so memory does not grow with the run:
``samples.jsonl`` and ``failures.jsonl`` a line per record, the
``trajectories/`` dataset with :class:`~.dataset.TrajectoryDatasetWriter`.
Records come from a run as its episodes finish (:mod:`.live`) or from the
ledgers (:mod:`scaffold_core.run.finalize`); a record's token arrays are
lists, or packed in the blob that comes with it (:mod:`.tokens`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from .codec import dumps_compact, dumps_finite, values_finite
from .dataset import (
    CHUNK_ROWS,
    ExtraColumns,
    TrajectoryDatasetWriter,
    extra_features,
    save_trajectories,
    token_count,
    trajectory_features,
)
from .files import file_mode, open_nofollow

__all__ = ["CHUNK_ROWS", "DerivedWriter", "ExtraColumns", "Records", "TrajectoryDatasetWriter", "extra_features",
           "save_trajectories", "trajectory_features", "write_derived"]

#: Records in output order, as a mapping (episode id -> record, sorted here) or a callable that starts a
#: fresh pass over them each time it is called (the dataset may need a second pass, see write_derived).
#: A record is a ledger record: its token columns are lists, or segments of the blob that comes with it
#: (a ``(record, blob)`` pair).
Records = Mapping[str, dict[str, Any]] | Callable[[], Iterable[Any]]


def _passes(records: Records) -> Callable[[], Iterable[Any]]:
    if isinstance(records, Mapping):
        ordered = sorted(records.values(), key=lambda r: (r.get("index", 0), r["episode_id"]))
        return lambda: ordered
    return records


def _split(item: Any) -> tuple[dict[str, Any], bytes]:
    return item if isinstance(item, tuple) else (item, b"")


def write_derived(directory: Path, records: Records, *, save_dataset: bool = True,
                  private: bool = True) -> dict[str, int]:
    """Write samples.jsonl, failures.jsonl and the trajectories dataset from ledger records (each to a
    fresh temp name renamed into place: never through a link).

    ``records``: episode id -> record (ordered here by ``(index, episode_id)``), or a callable returning
    the records (or ``(record, blob)`` pairs) already in that order, one pass per call. One pass writes
    everything; a second pass is made only when the dataset's extra columns (see
    :class:`TrajectoryDatasetWriter`) change after its first chunk.
    """
    passes = _passes(records)
    out = DerivedWriter(directory, save_dataset, private=private)
    try:
        for item in passes():
            out.add(*_split(item))
        return out.finish(passes)
    finally:
        out.abort()


class DerivedWriter:
    """Writes samples, failures and dataset rows record by record to temp files; :meth:`finish` puts them
    in place in ``directory``. A writer for one ``part`` of the records writes into that folder instead
    (``samples.part``, ``failures.part``, the dataset's shards), and :meth:`part` closes its files for the
    writer that :meth:`join` appends them after its own.

    ``kinds``: the dataset's extra columns, fixed (else the writer picks them from its first chunk).
    """

    def __init__(self, directory: Path, save_dataset: bool, *, private: bool = True, part: Path | None = None,
                 kinds: Mapping[str, str] | None = None):
        self.directory = directory
        self.private = private
        if part is None:
            self.samples_path, self.samples = _fresh_file(directory, "samples.jsonl", private)
            self.failures_path, self.failures = _fresh_file(directory, "failures.jsonl", private)
        else:
            self.samples_path, self.failures_path = part / "samples.part", part / "failures.part"
            self.samples, self.failures = _new_file(self.samples_path, private), _new_file(self.failures_path, private)
        dataset_tmp = None if part is None else part / "trajectories"
        self.dataset = (TrajectoryDatasetWriter(directory, kinds, tmp=dataset_tmp, private=private)
                        if save_dataset else None)
        self.counts = {"samples": 0, "failed": 0, "trajectories": 0}

    def add(self, rec: dict[str, Any], blob: bytes = b"") -> tuple[int, int, int, int]:
        """Write one record; (bytes of samples lines, bytes of failure lines, dataset rows, their tokens)."""
        counts = self.counts
        if rec["status"] != "ok":
            counts["failed"] += 1
            line = dumps_compact({k: rec.get(k) for k in ("episode_id", "index", "error_component", "error",
                                                          "attempts", "answer")}) + b"\n"
            self.failures.write(line)
            return 0, len(line), 0, 0
        chosen = rec.get("chosen")
        lines = []
        eid, prompt, answer = rec["episode_id"], rec["prompt"], rec["answer"]
        for s in rec["samples"]:
            lines.append(_dumps({
                "episode_id": eid, "sample_index": s["sample_index"], "prompt": prompt,
                "response": s["response"], "answer": answer, "extracted": s["extracted"],
                "reward": s["reward"], "reason": s["reason"], "finish_reason": s["finish_reason"],
                "generated_tokens": s["generated_tokens"],
                "chosen": chosen == s["sample_index"] if chosen is not None else None,
                **({"turn_rewards": s["turn_rewards"]} if "turn_rewards" in s else {}),
            }))
        written = 0
        if lines:
            lines.append(b"")
            data = b"\n".join(lines)
            self.samples.write(data)
            written = len(data)
        counts["samples"] += len(rec["samples"])
        trajectories = rec.get("trajectories") or []
        counts["trajectories"] += len(trajectories)
        tokens = 0
        add = self.dataset.add if self.dataset is not None else None
        for row in trajectories:
            n = token_count(row.get("input_ids"))
            tokens += n
            if add is not None:
                add(row, blob, n)
        return written, 0, len(trajectories), tokens

    def part(self) -> dict[str, Any]:
        """Close this part's files; what the joining process needs to know about them."""
        self.samples.close()
        self.failures.close()
        shards = self.dataset.close_shards() if self.dataset is not None else []
        found = self.dataset.seen.found if self.dataset is not None else {}
        return {"samples": str(self.samples_path), "failures": str(self.failures_path), "counts": self.counts,
                "shards": [str(p) for p in shards], "found": [[key, sorted(types, key=str)]
                                                             for key, types in found.items()],
                "kinds": self.dataset.kinds if self.dataset is not None else None}

    def join(self, part: dict[str, Any]) -> None:
        """Append a later part (from :meth:`part`) after what was written here."""
        for path, target in ((part["samples"], self.samples), (part["failures"], self.failures)):
            with open(path, "rb") as fh:
                shutil.copyfileobj(fh, target, 1 << 20)
        for key, value in part["counts"].items():
            self.counts[key] += value
        if self.dataset is not None:
            self.dataset.adopt([Path(p) for p in part["shards"]], {key: set(types) for key, types in part["found"]},
                               part.get("kinds"))

    def finish(self, passes: Callable[[], Iterable[Any]] | None) -> dict[str, int]:
        self.samples.close()
        self.failures.close()
        os.replace(self.samples_path, self.directory / "samples.jsonl")
        os.replace(self.failures_path, self.directory / "failures.jsonl")
        dataset = self.dataset
        if dataset is not None:
            if dataset.stale:  # the extra columns changed after the first chunk: write again with them
                if passes is None:
                    raise ValueError("extra dataset columns need a second pass over the records")
                dataset = self.dataset = dataset.restart()
                for item in passes():
                    rec, blob = _split(item)
                    if rec["status"] == "ok":
                        for row in rec.get("trajectories") or []:
                            dataset.add(row, blob)
            dataset.finish()
            self.dataset = None
        return dict(self.counts)

    def abort(self) -> None:
        """Drop whatever is not in place yet (temp files and folders)."""
        for fh in (self.samples, self.failures):
            fh.close()
        if self.dataset is not None:
            self.dataset.abort()
            self.dataset = None
        for tmp in (self.samples_path, self.failures_path):
            tmp.unlink(missing_ok=True)


def _dumps(line: dict[str, Any]) -> bytes:
    """:func:`dumps_compact` of a samples line, without orjson's read-back of the JSON when no value holds a
    NaN or infinity (orjson writes those as null)."""
    data = dumps_finite(line) if values_finite(line.values()) else None
    return data if data is not None else dumps_compact(line)


def _new_file(path: Path, private: bool) -> IO[bytes]:
    """A file of a part's folder, created (replacing one there) with the run's mode (a large buffer: few writes)."""
    return os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode(private)), "wb",
                     buffering=1 << 20)


def _fresh_file(directory: Path, name: str, private: bool) -> tuple[Path, IO[bytes]]:
    """A new file with a unique name starting with ``.name.`` in ``directory`` (created exclusively:
    never an existing file or link), 0600 unless shared; renamed over ``name`` when complete."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    if not private:
        os.fchmod(fd, file_mode(False))
    return Path(tmp), os.fdopen(fd, "wb")


# -- column kinds --------------------------------------------------------------------------------------
