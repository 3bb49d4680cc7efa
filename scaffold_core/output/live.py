"""A process's share of the derived files, written from memory while its episodes finish: no second pass.

Every record a process appends to its ledger (see :meth:`.rundir.RunOutput.append`) also goes, with
the blob of its token arrays, to the process's :class:`LivePart`: a temp folder of the run directory
(``.derived.XXXXXXXX``) where its samples lines, failure lines and dataset rows are written as the
run goes (:class:`.derived.DerivedWriter`, in part mode). The derived files are in ``(index,
episode_id)`` order, so a record waits until the records of every index before it (the indices its
process started before it) have left; at most :data:`WINDOW` wait, and a record whose index is below
one that already left (a straggler) starts a new *segment*.
Each segment is in order; :mod:`.join` merges them (one segment: its files are renamed into place).

The ledger stays the source of truth. A part is used only when, at the end, the parts cover the
ledgers exactly; otherwise (a resumed run, a killed worker, a run dir changed meanwhile) the files
are derived from the ledgers again. A killed process leaves its part behind: the next run on the
directory removes it (a ``.derived.*`` temp name).
"""

from __future__ import annotations

import heapq
import json
import logging
import shutil
import zlib
from array import array
from itertools import count
from pathlib import Path
from typing import Any

from .derived import DerivedWriter
from .files import fresh_dir

log = logging.getLogger("scaffold.output")

#: The temp name of a part folder: ``.derived.XXXXXXXX`` in the run directory.
PART_NAME = "derived"
#: The manifest a finished part leaves in its folder.
MANIFEST = "part.json"
#: Records that wait to leave in index order.
WINDOW = 2048
#: Per episode of a segment: index, id hash, bytes of samples lines, bytes of failure lines, dataset rows,
#: tokens (the lengths of its rows' input_ids).
FIELDS = ("index", "hash", "sample_bytes", "failure_bytes", "rows", "tokens")


def id_hash(episode_id: str) -> int:
    """A 63-bit hash of an episode id, the same in every process (``hash()`` is salted per process)."""
    data = episode_id.encode("utf-8", "surrogatepass")
    return (zlib.adler32(data) & 0x7FFFFFFF) << 32 | zlib.crc32(data)


class _Segment:
    """Records in index order: their derived files in ``folder`` and a line per record in the manifest."""

    def __init__(self, folder: Path, save_dataset: bool, kinds: dict[str, str] | None, private: bool):
        folder.mkdir()
        self.folder = folder
        self.writer = DerivedWriter(folder, save_dataset, private=private, part=folder, kinds=kinds)
        self.columns = [array("q") for _ in FIELDS]
        self.last: tuple[int, str] | None = None

    def add(self, key: tuple[int, str], record: dict[str, Any], blob: bytes) -> None:
        sample_bytes, failure_bytes, rows, tokens = self.writer.add(record, blob)
        index, hashes, samples, failures, counts, lengths = self.columns  # FIELDS
        index.append(key[0])
        hashes.append(id_hash(key[1]))
        samples.append(sample_bytes)
        failures.append(failure_bytes)
        counts.append(rows)
        lengths.append(tokens)
        self.last = key

    def close(self) -> dict[str, Any]:
        import numpy as np

        info = self.writer.part()
        episodes = np.stack([np.frombuffer(column, dtype=np.int64) for column in self.columns])
        np.save(self.folder / "episodes.npy", episodes)
        return {"folder": self.folder.name, "episodes": int(episodes.shape[1]),
                "shards": [Path(p).relative_to(self.folder).as_posix() for p in info["shards"]],
                "kinds": info["kinds"], "stale": bool(self.writer.dataset is not None and self.writer.dataset.stale),
                "counts": info["counts"]}


class LivePart:
    """The derived files of one process's records, written as they arrive (see the module's doc)."""

    def __init__(self, directory: Path, save_dataset: bool, *, private: bool = True, first: int = 0, step: int = 1):
        """``first``, ``step``: the indices of the records to come, in the order they were started (a shard
        of a run: ``rank``, ``world_size``); a record leaves as soon as every index before it has."""
        self.directory = Path(directory)
        self._next = first
        self._step = max(1, step)
        self.save_dataset = save_dataset
        self.private = private
        self.folder = fresh_dir(self.directory, PART_NAME, private=private)
        self._heap: list[tuple[int, str, int, dict[str, Any], bytes]] = []
        self._order = count()
        self._segments: list[dict[str, Any]] = []
        self._current: _Segment | None = None
        self._kinds: dict[str, str] | None = None

    def add(self, record: dict[str, Any], blob: bytes) -> None:
        index = record.get("index", 0)
        if type(index) is not int:
            raise ValueError(f"episode {record['episode_id']!r} has index {index!r}, not an integer")
        heap = self._heap
        if index == self._next and not heap:  # the next one, nothing waiting: it leaves at once
            self._next += self._step
            self._write((index, record["episode_id"]), record, blob)
            return
        heapq.heappush(heap, (index, record["episode_id"], next(self._order), record, blob))
        while heap and heap[0][0] <= self._next:
            if heap[0][0] == self._next:
                self._next += self._step
            self._release()
        if len(heap) > WINDOW:  # a straggler holds the others back: let them go (it will start a segment)
            self._next = max(self._next, heap[0][0] + self._step)
            self._release()

    def _release(self) -> None:
        index, eid, _, record, blob = heapq.heappop(self._heap)
        self._write((index, eid), record, blob)

    def _write(self, key: tuple[int, str], record: dict[str, Any], blob: bytes) -> None:
        segment = self._current
        if segment is None or (segment.last is not None and key < segment.last):
            segment = self._new_segment()
        segment.add(key, record, blob)

    def _new_segment(self) -> _Segment:
        if self._current is not None:
            self._close_current()
        self._current = _Segment(self.folder / f"seg-{len(self._segments):04d}", self.save_dataset, self._kinds,
                                 self.private)
        return self._current

    def _close_current(self) -> None:
        assert self._current is not None
        info = self._current.close()
        if self._kinds is None:
            self._kinds = info["kinds"]
        self._segments.append(info)
        self._current = None

    def finish(self, *, ledger: str, start: int, end: int, metrics: dict[str, Any] | None) -> Path:
        """Write what waits, close the files and leave the manifest; the part's folder.

        ``ledger``: the name of the ledger these records were appended to, from byte ``start`` to ``end``;
        ``metrics``: the totals of these records (kept for the process that joins the parts).
        """
        while self._heap:
            self._release()
        if self._current is not None:
            self._close_current()
        manifest = {"ledger": ledger, "start": start, "end": end, "save_dataset": self.save_dataset,
                    "segments": self._segments, "metrics": metrics}
        (self.folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
        return self.folder

    def abort(self) -> None:
        """Drop the part (its folder)."""
        self._heap = []
        if self._current is not None:
            try:
                self._current.writer.abort()
            except Exception:  # the folder goes anyway
                pass
            self._current = None
        shutil.rmtree(self.folder, ignore_errors=True)
