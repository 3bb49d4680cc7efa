"""Files derived from the ledger at the end of a run: samples, failures and the trajectories dataset.

They are written by streaming over the episodes' records in ``(index,
episode_id)`` order, a chunk at a time, so memory does not grow with the
run: ``samples.jsonl`` and ``failures.jsonl`` a line per record, the
``trajectories/`` dataset as Arrow shards in the layout
``datasets.Dataset.save_to_disk`` writes (load it with
``datasets.load_from_disk``), with the same rows and types as
``Dataset.from_dict(columns, features=features).save_to_disk(...)``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from .codec import dumps_compact
from .files import file_mode, fresh_dir, replace_dir, set_tree_modes

#: Records in output order, as a mapping (episode id -> record, sorted here) or a callable that starts a
#: fresh pass over them each time it is called (the dataset may need a second pass, see write_derived).
Records = Mapping[str, dict[str, Any]] | Callable[[], Iterable[dict[str, Any]]]

#: Rows per Arrow chunk: bounds the memory of a chunk of 1,000-token rows to a few megabytes.
CHUNK_ROWS = 256


def _passes(records: Records) -> Callable[[], Iterable[dict[str, Any]]]:
    if isinstance(records, Mapping):
        ordered = sorted(records.values(), key=lambda r: (r.get("index", 0), r["episode_id"]))
        return lambda: ordered
    return records


def write_derived(directory: Path, records: Records, *, save_dataset: bool = True,
                  private: bool = True) -> dict[str, int]:
    """Write samples.jsonl, failures.jsonl and the trajectories dataset from ledger records (each to a
    fresh temp name renamed into place: never through a link).

    ``records``: episode id -> record (ordered here by ``(index, episode_id)``), or a callable returning
    the records already in that order, one pass per call. One pass writes everything; a second pass is
    made only when trajectories carry extra columns (their types are known once every row was seen).
    """
    passes = _passes(records)
    out = DerivedWriter(directory, save_dataset, private=private)
    try:
        for rec in passes():
            out.add(rec)
        return out.finish(passes)
    finally:
        out.abort()


class DerivedWriter:
    """Writes samples, failures and dataset rows record by record to temp files; :meth:`finish` puts them
    in place in ``directory``. A writer for one ``part`` of the records (``scaffold_core.output.parts``)
    writes into that folder instead, and :meth:`part` closes its files for the writer that :meth:`join`
    appends them after its own."""

    def __init__(self, directory: Path, save_dataset: bool, *, private: bool = True, part: Path | None = None):
        self.directory = directory
        self.private = private
        if part is None:
            self.samples_path, self.samples = _fresh_file(directory, "samples.jsonl", private)
            self.failures_path, self.failures = _fresh_file(directory, "failures.jsonl", private)
        else:
            self.samples_path, self.failures_path = part / "samples.part", part / "failures.part"
            self.samples, self.failures = self.samples_path.open("wb"), self.failures_path.open("wb")
        dataset_tmp = None if part is None else part / "trajectories"
        self.dataset = (TrajectoryDatasetWriter(directory, tmp=dataset_tmp, private=private)
                        if save_dataset else None)
        self.counts = {"samples": 0, "failed": 0, "trajectories": 0}

    def add(self, rec: dict[str, Any]) -> None:
        counts = self.counts
        if rec["status"] != "ok":
            counts["failed"] += 1
            self.failures.write(dumps_compact({k: rec.get(k) for k in ("episode_id", "index", "error_component",
                                                                       "error", "attempts", "answer")}) + b"\n")
            return
        chosen = rec.get("chosen")
        write = self.samples.write
        for s in rec["samples"]:
            counts["samples"] += 1
            write(dumps_compact({
                "episode_id": rec["episode_id"], "sample_index": s["sample_index"], "prompt": rec["prompt"],
                "response": s["response"], "answer": rec["answer"], "extracted": s["extracted"],
                "reward": s["reward"], "reason": s["reason"], "finish_reason": s["finish_reason"],
                "generated_tokens": s["generated_tokens"],
                "chosen": chosen == s["sample_index"] if chosen is not None else None,
                **({"turn_rewards": s["turn_rewards"]} if "turn_rewards" in s else {}),
            }) + b"\n")
        trajectories = rec.get("trajectories") or []
        counts["trajectories"] += len(trajectories)
        if self.dataset is not None:
            for row in trajectories:
                self.dataset.add(row)

    def part(self) -> dict[str, Any]:
        """Close this part's files; what the joining process needs to know about them."""
        self.samples.close()
        self.failures.close()
        shards = self.dataset.close_shards() if self.dataset is not None else []
        found = self.dataset.seen.found if self.dataset is not None else {}
        return {"samples": str(self.samples_path), "failures": str(self.failures_path), "counts": self.counts,
                "shards": [str(p) for p in shards], "found": [[key, sorted(types, key=str)]
                                                             for key, types in found.items()]}

    def join(self, part: dict[str, Any]) -> None:
        """Append a later part (from :meth:`part`) after what was written here."""
        for path, target in ((part["samples"], self.samples), (part["failures"], self.failures)):
            with open(path, "rb") as fh:
                shutil.copyfileobj(fh, target, 1 << 20)
        for key, value in part["counts"].items():
            self.counts[key] += value
        if self.dataset is not None:
            self.dataset.adopt([Path(p) for p in part["shards"]], {key: set(types) for key, types in part["found"]})

    def finish(self, passes: Callable[[], Iterable[dict[str, Any]]] | None) -> dict[str, int]:
        self.samples.close()
        self.failures.close()
        os.replace(self.samples_path, self.directory / "samples.jsonl")
        os.replace(self.failures_path, self.directory / "failures.jsonl")
        dataset = self.dataset
        if dataset is not None:
            if dataset.extra:  # columns a trajectory maker added: write again with them (second pass)
                if passes is None:
                    raise ValueError("extra dataset columns need a second pass over the records")
                dataset = self.dataset = dataset.restart()
                for rec in passes():
                    if rec["status"] == "ok":
                        for row in rec.get("trajectories") or []:
                            dataset.add(row)
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


def _fresh_file(directory: Path, name: str, private: bool) -> tuple[Path, IO[bytes]]:
    """A new file with a unique name starting with ``.name.`` in ``directory`` (created exclusively:
    never an existing file or link), 0600 unless shared; renamed over ``name`` when complete."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    if not private:
        os.fchmod(fd, file_mode(False))
    return Path(tmp), os.fdopen(fd, "wb")


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

    def add(self, row: Mapping[str, Any]) -> None:
        if row.keys() <= self.known:
            return
        for key, value in row.items():
            if key not in self.known and value is not None:
                self.found.setdefault(key, set()).add(_value_type(value))

    def features(self) -> dict[str, Any]:
        import datasets

        out: dict[str, Any] = {}
        for key, types in self.found.items():
            if None in types:
                continue
            if types <= {"list:int64", "list:float32"}:
                out[key] = datasets.Sequence(datasets.Value("float32" if "list:float32" in types else "int64"))
            elif types <= {"int64", "float32"}:
                out[key] = datasets.Value("float32" if "float32" in types else "int64")
            elif len(types) == 1:
                out[key] = datasets.Value(next(iter(types)))
        return out


def extra_features(rows: Iterable[Mapping[str, Any]], known: Any) -> dict[str, Any]:
    """Dataset columns for keys a trajectory maker adds beyond the standard ones (e.g. a multi-turn
    maker's ``turn_rewards``): numbers, strings, booleans and lists of numbers are kept; other
    values stay in ``episodes.jsonl`` only."""
    extra = ExtraColumns(known)
    for row in rows:
        extra.add(row)
    return extra.features()


def trajectory_features() -> Any:
    """The standard columns of the trajectories dataset."""
    import datasets

    return datasets.Features({
        "input_ids": datasets.Sequence(datasets.Value("int64")),
        "loss_mask": datasets.Sequence(datasets.Value("int8")),
        "logprobs": datasets.Sequence(datasets.Value("float32")),
        "versions": datasets.Sequence(datasets.Value("int32")),
        "reward": datasets.Value("float32"),
        "advantage": datasets.Value("float32"),
        "episode_id": datasets.Value("string"),
        "sample_index": datasets.Value("int32"),
        "group_id": datasets.Value("string"),
        "prompt_len": datasets.Value("int32"),
        "finish_reason": datasets.Value("string"),
    })


class TrajectoryDatasetWriter:
    """Writes training rows to ``directory/trajectories`` a chunk at a time (via a temp folder, renamed
    into place by :meth:`finish`), with the standard columns plus ``extra_columns``.

    Rows whose extra keys are not among the columns are still written (without them); :attr:`extra`
    then holds the columns they call for, and :meth:`restart` begins again with those columns.
    """

    def __init__(self, directory: Path, extra_columns: Mapping[str, Any] | None = None, *, tmp: Path | None = None,
                 private: bool = True):
        import datasets
        from datasets.utils.py_utils import convert_file_size_to_int

        self.directory = Path(directory)
        self.features = trajectory_features()
        self.features.update(extra_columns or {})
        self._extra_columns = dict(extra_columns or {})
        self._plain = _plain_types(self.features)
        self.seen = ExtraColumns(self.features)
        self.private = private
        self._own_tmp = tmp is None  # a fresh folder of its own (else a given one, in a part's folder)
        if tmp is None:
            self.tmp = fresh_dir(self.directory, "trajectories", private=private)
        else:
            self.tmp = tmp
            if self.tmp.exists():
                shutil.rmtree(self.tmp)
            self.tmp.mkdir(parents=True)
        self._rows: list[Mapping[str, Any]] = []
        self._shards: list[Path] = []
        self._writer: Any = None
        self._shard_bytes = 0
        self._max_shard_bytes = convert_file_size_to_int(datasets.config.MAX_SHARD_SIZE)

    @property
    def extra(self) -> dict[str, Any]:
        """Columns seen rows call for beyond this writer's columns."""
        return self.seen.features()

    def add(self, row: Mapping[str, Any]) -> None:
        self.seen.add(row)
        self._rows.append(row)
        if len(self._rows) >= CHUNK_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        import pyarrow as pa
        from datasets.arrow_writer import ArrowWriter, OptimizedTypedSequence

        rows, self._rows = self._rows, []
        features = self.features
        # As Dataset.from_dict(columns, features=features) builds its table: encode, then type each column.
        # Encoding leaves values of exactly the column's Python type as they are: skip it when all are.
        plain = self._plain is not None and all(_is_plain(row, self._plain) for row in rows)
        columns = {name: [row.get(name) for row in rows] for name in features}
        arrays = [pa.array(OptimizedTypedSequence(column if plain else features.encode_column(column, name),
                                                  type=features[name], col=name))
                  for name, column in columns.items()]
        table = pa.Table.from_arrays(arrays, names=list(features))
        if self._writer is not None and self._shard_bytes >= self._max_shard_bytes:
            self._close_shard()
        if self._writer is None:
            path = self.tmp / f".shard-{len(self._shards):05d}.arrow"
            self._shards.append(path)
            self._writer = ArrowWriter(features=features, path=str(path), embed_local_files=True)
            self._shard_bytes = 0
        self._writer.write_table(table)
        self._shard_bytes += table.nbytes

    def _close_shard(self) -> None:
        if self._writer is not None:
            self._writer.finalize()
            self._writer.close()
            self._writer = None

    def restart(self) -> TrajectoryDatasetWriter:
        """A new writer for the same directory with the extra columns seen so far."""
        extra = {**self._extra_columns, **self.extra}
        self.abort()
        return TrajectoryDatasetWriter(self.directory, extra, tmp=None if self._own_tmp else self.tmp,
                                       private=self.private)

    def close_shards(self) -> list[Path]:
        """Write what is buffered and close the current shard; the shard files, in order."""
        self._flush()
        self._close_shard()
        return list(self._shards)

    def adopt(self, shards: list[Path], found: Mapping[str, set[str | None]]) -> None:
        """Take shards another writer (same columns) wrote for the rows after this one's, and what it saw."""
        self.close_shards()
        self._shards.extend(shards)
        for key, types in found.items():
            self.seen.found.setdefault(key, set()).update(types)

    def finish(self) -> None:
        """Complete the dataset and move it to ``trajectories/`` (replacing an earlier one)."""
        import datasets

        self.close_shards()
        quiet = not datasets.are_progress_bars_disabled()
        if quiet:
            datasets.disable_progress_bars()  # the run has its own progress bar; this one is noise
        try:
            # An empty dataset with these features writes state.json and dataset_info.json exactly as
            # save_to_disk does; the shards written here are then listed in state.json.
            empty = datasets.Dataset.from_dict({name: [] for name in self.features}, features=self.features)
            empty.save_to_disk(str(self.tmp))
        finally:
            if quiet:
                datasets.enable_progress_bars()
        if not self._shards:  # datasets cannot load a dataset of no shards: write one empty shard
            from datasets.arrow_writer import ArrowWriter

            empty_shard = self.tmp / "empty.arrow"
            writer = ArrowWriter(features=self.features, path=str(empty_shard))
            try:
                writer.finalize()
            finally:
                writer.close()
            self._shards.append(empty_shard)
        names = []
        for i, shard in enumerate(self._shards):  # adopted shards sit in folders of their own: moved in here
            name = f"data-{i:05d}-of-{len(self._shards):05d}.arrow"
            os.replace(shard, self.tmp / name)
            names.append(name)
        if names:
            state_path = self.tmp / datasets.config.DATASET_STATE_JSON_FILENAME
            state = json.loads(state_path.read_text(encoding="utf-8"))
            state["_data_files"] = [{"filename": name} for name in names]
            with state_path.open("w", encoding="utf-8") as fh:
                json.dump(state, fh, indent=2, sort_keys=True)
        set_tree_modes(self.tmp, private=self.private)
        replace_dir(self.tmp, self.directory / "trajectories")

    def abort(self) -> None:
        """Drop what was written (the temp folder)."""
        try:
            self._close_shard()
        finally:
            self._rows = []
            shutil.rmtree(self.tmp, ignore_errors=True)


_PYTHON_TYPES = {"bool": bool, "string": str, "large_string": str}


def _python_type(feature: Any) -> type | None:
    """The Python type a ``Value`` feature's encoding returns unchanged (int for int32, ...), else None."""
    import datasets

    if not isinstance(feature, datasets.Value):
        return None
    dtype = feature.dtype
    if dtype in _PYTHON_TYPES:
        return _PYTHON_TYPES[dtype]
    if dtype.startswith(("int", "uint")):
        return int
    return float if dtype.startswith("float") else None


def _plain_types(features: Any) -> list[tuple[str, bool, type]] | None:
    """(column, is a list, Python type) per column, when every column is a Value or a list of Values."""
    import datasets

    lists = tuple(t for t in (getattr(datasets, "List", None), getattr(datasets, "LargeList", None)) if t is not None)
    if not lists:  # an older datasets: always encode
        return None
    out = []
    for name, feature in features.items():
        is_list = isinstance(feature, lists)
        kind = _python_type(feature.feature if is_list else feature)
        if kind is None:
            return None
        out.append((name, is_list, kind))
    return out


def _is_plain(row: Mapping[str, Any], kinds: list[tuple[str, bool, type]]) -> bool:
    """True when encoding ``row`` for the dataset changes nothing: each value is None, of its column's exact
    type, or a list whose first element is (datasets checks the first element of a list to decide)."""
    for name, is_list, kind in kinds:
        value = row.get(name)
        if value is None:
            continue
        if is_list:
            if type(value) is not list or (value and type(value[0]) is not kind):
                return False
        elif type(value) is not kind:
            return False
    return True


def save_trajectories(directory: Path, ordered: Iterable[dict[str, Any]], *, private: bool = True) -> None:
    """Save the training sequences of ``ordered`` records with ``datasets`` (load with ``datasets.load_from_disk``)."""
    records = ordered if isinstance(ordered, list) else list(ordered)

    def rows() -> Iterator[Mapping[str, Any]]:
        return (t for rec in records if rec["status"] == "ok" for t in (rec.get("trajectories") or []))

    writer = TrajectoryDatasetWriter(directory, private=private)
    try:
        for row in rows():
            writer.add(row)
        if writer.extra:
            writer = writer.restart()
            for row in rows():
                writer.add(row)
        writer.finish()
    except BaseException:
        writer.abort()
        raise
