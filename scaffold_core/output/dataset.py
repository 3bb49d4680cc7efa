"""The trajectories dataset: written a chunk of rows at a time, in the layout ``datasets`` saves.

``trajectories/`` holds Arrow stream shards and the ``state.json`` and
``dataset_info.json`` that ``datasets.Dataset.save_to_disk`` writes (load it
with ``datasets.load_from_disk``), with the same rows and types as
``Dataset.from_dict(columns, features=features).save_to_disk(...)``. Only
pyarrow is needed to write it (``datasets`` is imported only for values its
encoding converts, see :mod:`.columns`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .columns import STANDARD_KINDS, build_batch, dataset_schema, datasets_feature, feature_dict
from .files import fresh_dir, replace_dir, set_tree_modes
from .reserve import Reservation
from .writeback import DropBehind

#: Rows per Arrow chunk, and tokens per chunk: bound the memory of a chunk to a few megabytes.
CHUNK_ROWS = 256
CHUNK_TOKENS = 1 << 22
#: ``datasets.config.MAX_SHARD_SIZE``: a shard is closed once it holds this many bytes.
MAX_SHARD_BYTES = 500 << 20


_SCALAR_TYPES = ((bool, "bool"), (int, "int64"), (float, "float32"), (str, "string"))


def _value_type(value: Any) -> str | None:
    """The dataset type of one value: a scalar type, ``list:int64``/``list:float32``, or None (no column)."""
    if isinstance(value, (list, tuple)):
        inner = {_value_type(v) for v in value}
        if inner <= {"int64"}:
            return "list:int64"
        return "list:float32" if inner <= {"int64", "float32"} else None
    return next((name for cls, name in _SCALAR_TYPES if isinstance(value, cls)), None)


class ExtraColumns:
    """Collects the keys rows carry beyond ``known`` and the dataset types of their values, row by row."""

    def __init__(self, known: Any):
        self.known = set(known)
        self.found: dict[str, set[str | None]] = {}

    def add(self, row: Mapping[str, Any]) -> bool:
        """Note the row's extra keys; whether it had any."""
        if row.keys() <= self.known:
            return False
        for key, value in row.items():
            if key not in self.known and value is not None:
                self.found.setdefault(key, set()).add(_value_type(value))
        return True

    def kinds(self) -> dict[str, str]:
        """The columns the found keys call for: numbers, strings, booleans and lists of numbers."""
        out: dict[str, str] = {}
        for key, types in self.found.items():
            if None in types:
                continue
            if types <= {"list:int64", "list:float32"}:
                out[key] = "list:float32" if "list:float32" in types else "list:int64"
            elif types <= {"int64", "float32"}:
                out[key] = "float32" if "float32" in types else "int64"
            elif len(types) == 1:
                out[key] = next(iter(types))  # type: ignore[assignment]
        return out

    def features(self) -> dict[str, Any]:
        return {key: datasets_feature(kind) for key, kind in self.kinds().items()}


def extra_features(rows: Iterable[Mapping[str, Any]], known: Any) -> dict[str, Any]:
    """Dataset columns for keys a trajectory maker adds beyond the standard ones (e.g. a multi-turn
    maker's ``turn_rewards``): numbers, strings, booleans and lists of numbers are kept; other
    values stay in ``episodes.jsonl`` only."""
    extra = ExtraColumns(known)
    for row in rows:
        extra.add(row)
    return extra.features()


def trajectory_features() -> Any:
    """The standard columns of the trajectories dataset (``datasets.Features``)."""
    import datasets

    return datasets.Features({name: datasets_feature(kind) for name, kind in STANDARD_KINDS.items()})


class TrajectoryDatasetWriter:
    """Writes training rows to ``directory/trajectories`` a chunk at a time (via a temp folder, renamed
    into place by :meth:`finish`).

    Its columns are the standard ones plus ``kinds`` (extra columns: name -> kind) when given; otherwise
    the extra columns of the rows of its first chunk. A later row that calls for other columns (a new
    key, or a wider type) makes the writer :attr:`stale`: it stops writing rows, and :meth:`restart`
    begins again with every column seen.
    """

    def __init__(self, directory: Path, kinds: Mapping[str, str] | None = None, *, tmp: Path | None = None,
                 private: bool = True):
        self.directory = Path(directory)
        self.seen = ExtraColumns(STANDARD_KINDS)
        self._fixed = dict(kinds) if kinds is not None else None
        self.kinds: dict[str, str] | None = None if kinds is None else {**STANDARD_KINDS, **kinds}
        self.stale = False
        self.private = private
        self._own_tmp = tmp is None  # a fresh folder of its own (else a given one, in a part's folder)
        if tmp is None:
            self.tmp = fresh_dir(self.directory, "trajectories", private=private)
        else:
            self.tmp = tmp
            if self.tmp.exists():
                shutil.rmtree(self.tmp)
            self.tmp.mkdir(parents=True)
        self._rows: list[tuple[Mapping[str, Any], bytes]] = []
        self._tokens = 0
        self._shards: list[Path] = []
        self._writer: Any = None
        self._sink: Any = None
        self._reservation: Reservation | None = None
        self._behind: DropBehind | None = None  # the shard's pages handed back once on disk (written once, not read)
        self._shard_bytes = 0
        self._extras = False

    @property
    def extra(self) -> dict[str, Any]:
        """Columns seen rows call for beyond the standard ones (``datasets`` features)."""
        return self.seen.features()

    def add(self, row: Mapping[str, Any], blob: bytes = b"", tokens: int | None = None) -> None:
        """Buffer one row (``tokens``: the length of its ``input_ids``, when the caller knows it)."""
        if self.seen.add(row):
            self._extras = True
        if self.stale:
            return
        rows = self._rows
        rows.append((row, blob))
        self._tokens += token_count(row.get("input_ids")) if tokens is None else tokens
        if len(rows) >= CHUNK_ROWS or self._tokens >= CHUNK_TOKENS:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        if self.kinds is None:  # the first chunk decides the extra columns
            self.kinds = {**STANDARD_KINDS, **self.seen.kinds()}
        elif self._extras and {**self.kinds, **self.seen.kinds()} != self.kinds:
            self.stale = True
        if self.stale:
            self._rows = []
            return
        rows, self._rows, self._tokens = self._rows, [], 0
        self.write_batch(build_batch(rows, self.kinds))

    def write_batch(self, batch: Any) -> None:
        """Append rows already built (a pyarrow RecordBatch with this writer's columns)."""
        import pyarrow as pa

        if self._writer is not None and self._shard_bytes >= MAX_SHARD_BYTES:
            self._close_shard()
        if self._writer is None:
            if self.kinds is None:
                self.kinds = {**STANDARD_KINDS, **self.seen.kinds()}
            path = self.tmp / f".shard-{len(self._shards):05d}.arrow"
            self._shards.append(path)
            self._sink = pa.BufferedOutputStream(pa.OSFile(str(path), "wb"), 1 << 20)
            self._reservation = Reservation(path)
            self._behind = DropBehind(path)
            self._writer = pa.ipc.new_stream(self._sink, dataset_schema(self.kinds))
            self._shard_bytes = 0
        self._shard_bytes += batch.nbytes
        if self._reservation is not None:
            self._reservation.ensure(self._shard_bytes + (1 << 20))
        self._writer.write_batch(batch)
        if self._behind is not None:
            self._behind.advance(self._sink.tell() - (1 << 20))  # less what the sink may still buffer

    def _close_shard(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._sink.close()
                self._writer = self._sink = None
                if self._reservation is not None:
                    self._reservation.close()
                    self._reservation = None
                if self._behind is not None:
                    self._behind.close()
                    self._behind = None

    def restart(self) -> TrajectoryDatasetWriter:
        """A new writer for the same directory with every extra column seen so far."""
        kinds = {**(self._fixed or {}), **self.seen.kinds()}
        self.abort()
        writer = TrajectoryDatasetWriter(self.directory, kinds, tmp=None if self._own_tmp else self.tmp,
                                         private=self.private)
        return writer

    def close_shards(self) -> list[Path]:
        """Write what is buffered and close the current shard; the shard files, in order."""
        self._flush()
        self._close_shard()
        return list(self._shards)

    def adopt(self, shards: list[Path], found: Mapping[str, set[str | None]], kinds: Mapping[str, str] | None
              ) -> None:
        """Take shards another writer wrote (with ``kinds``) for the rows after this one's, and what it saw."""
        self.close_shards()
        if self.kinds is None:
            self.kinds = dict(kinds) if kinds is not None else None
        if shards and kinds is not None and dict(kinds) != self.kinds:
            self.stale = True
        self._shards.extend(shards)
        for key, types in found.items():
            self.seen.found.setdefault(key, set()).update(types)
            self._extras = True
        if self.kinds is not None and {**self.kinds, **self.seen.kinds()} != self.kinds:
            self.stale = True

    def finish(self) -> None:
        """Complete the dataset and move it to ``trajectories/`` (replacing an earlier one)."""
        self.close_shards()
        if self.stale:
            raise ValueError("the dataset's columns changed after its first chunk: restart() it")
        kinds = self.kinds or {**STANDARD_KINDS, **self.seen.kinds()}
        if not self._shards:  # datasets cannot load a dataset of no shards: write one empty shard
            self.kinds = kinds
            self.write_batch(build_batch([], kinds))
            self._close_shard()
        names = []
        for i, shard in enumerate(self._shards):  # adopted shards sit in folders of their own: moved in here
            name = f"data-{i:05d}-of-{len(self._shards):05d}.arrow"
            os.replace(shard, self.tmp / name)
            names.append(name)
        write_dataset_files(self.tmp, kinds, names)
        set_tree_modes(self.tmp, private=self.private)
        replace_dir(self.tmp, self.directory / "trajectories")

    def abort(self) -> None:
        """Drop what was written (the temp folder)."""
        try:
            self._close_shard()
        finally:
            self._rows = []
            shutil.rmtree(self.tmp, ignore_errors=True)


def write_dataset_files(folder: Path, kinds: Mapping[str, str], shards: list[str]) -> None:
    """``dataset_info.json`` and ``state.json`` of a dataset of these shards, as ``save_to_disk`` writes them."""
    info = {"citation": "", "description": "", "features": {n: feature_dict(k) for n, k in kinds.items()},
            "homepage": "", "license": ""}
    state: dict[str, Any] = {
        "_data_files": [{"filename": name} for name in shards], "_fingerprint": secrets.token_hex(8),
        "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
        "_split": None}
    (folder / "dataset_info.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    (folder / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")


def token_count(value: Any) -> int:
    """The number of values of a token column (a list, or segments of a blob)."""
    if isinstance(value, list):
        if value and isinstance(value[0], dict):  # segments
            return sum(seg.get("n", 0) for seg in value if isinstance(seg, dict))
        return len(value)
    return 0


# -- building a chunk ----------------------------------------------------------------------------------
def save_trajectories(directory: Path, ordered: Iterable[dict[str, Any]], *, private: bool = True) -> None:
    """Save the training sequences of ``ordered`` records with ``datasets`` (load with ``datasets.load_from_disk``)."""
    records = ordered if isinstance(ordered, list) else list(ordered)

    def rows() -> Iterator[tuple[Mapping[str, Any], bytes]]:
        for item in records:
            rec, blob = item if isinstance(item, tuple) else (item, b"")
            if rec["status"] == "ok":
                for t in rec.get("trajectories") or []:
                    yield t, blob

    writer = TrajectoryDatasetWriter(directory, private=private)
    try:
        for row, blob in rows():
            writer.add(row, blob)
        if writer.stale:
            writer = writer.restart()
            for row, blob in rows():
                writer.add(row, blob)
        writer.finish()
    except BaseException:
        writer.abort()
        raise
