"""What users and trainers read, exported from the run's store (:mod:`.store`): at the run's end, or, by a
process of its own (:class:`ExportProcess`), as the run goes.

One pass over the episodes in ``(index, episode_id)`` order writes:

* ``samples.jsonl``: one line per sample of a completed episode (prompt, response, reference answer,
  extracted answer, reward, finish reason); ``scaffold score`` re-scores it as it is;
* ``failures.jsonl``: one line per failed episode, with the component and the reason;
* ``trajectories/``: the training sequences of completed episodes as a Hugging Face dataset
  (``datasets.load_from_disk``), in the layout ``Dataset.save_to_disk`` writes and with the rows and
  types ``Dataset.from_dict(columns, features=features)`` gives, written with pyarrow;
* ``trajectories.parquet`` (``output.save_parquet``): the same rows and columns in one Parquet file
  (``datasets.load_dataset("parquet", ...)``, pandas, polars, DuckDB).

Each is written under a temp name and renamed into place, so a kill leaves the previous file or none.
The dataset's columns are the standard ones plus those the rows of its first chunk call for (e.g. a
multi-turn maker's ``turn_rewards``); when a later row calls for another, the dataset is written again
in a second pass over the store.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import accumulate
from pathlib import Path
from typing import IO, Any

from . import codec
from .files import file_mode, fresh_dir, replace_dir, set_tree_modes
from .store import RECORD, count_episodes, ordered_rows
from .tokens import TOKEN_COLUMNS, column_values, token_count

log = logging.getLogger("scaffold.output")

SAMPLES = "samples.jsonl"
FAILURES = "failures.jsonl"
DATASET = "trajectories"
PARQUET = "trajectories.parquet"
#: The standard columns of the trajectories dataset and their kinds (``list:`` is a sequence of values).
STANDARD_KINDS = {
    "input_ids": "list:int64", "loss_mask": "list:int8", "logprobs": "list:float32", "versions": "list:int32",
    "reward": "float32", "advantage": "float32", "episode_id": "string", "sample_index": "int32",
    "group_id": "string", "prompt_len": "int32", "finish_reason": "string",
}
#: Token columns a sequence may have or not (see :mod:`.tokens`), and their kinds when it has them: the store
#: keeps a placeholder in their place among the fields, so their kind is not read from the value.
OPTIONAL_KINDS = {"teacher_logprobs": "list:float32"}
#: Rows per Arrow chunk, and tokens per chunk: a chunk's memory stays a few megabytes.
CHUNK_ROWS = 256
CHUNK_TOKENS = 1 << 22
#: ``datasets.config.MAX_SHARD_SIZE``: a shard of the dataset is closed once it holds this many bytes.
MAX_SHARD_BYTES = 500 << 20
#: Rows per row group of the Parquet file (about 35 MB of columns for 1,000-token rows).
PARQUET_ROWS = 2048


def export_run(directory: Path, paths: list[Path], *, save_dataset: bool = True, save_parquet: bool = False,
               private: bool = True, on_head: Callable[[dict[str, Any]], None] | None = None,
               follower: ExportProcess | None = None) -> None:
    """Write the files above from the stores ``paths`` (each episode once, see
    :func:`~.store.ordered_rows`); ``on_head`` sees every episode's record without its training sequences,
    in order. ``follower``: the process that writes the files (a machine with a core to spare), told to
    finish here (it may have written most of them as the run went): this one only reads the heads for
    ``on_head`` meanwhile, or, when that process fails, writes the files itself."""
    if follower is not None:
        follower.end()
        if on_head is not None:  # while the process writes what is left
            _export(ordered_rows(paths, columns="CAST(head AS BLOB), NULL, NULL"), None, None, None, on_head)
            on_head = None
        if follower.wait():
            return
    dataset = DatasetWriter(directory, parquet=save_parquet, private=private) if save_dataset else None
    samples = _TempFile(directory, SAMPLES, private)
    failures = _TempFile(directory, FAILURES, private)
    try:
        _export(ordered_rows(paths, columns=RECORD if dataset is not None else "CAST(head AS BLOB), NULL, NULL"),
                samples, failures, dataset, on_head)
        samples.commit()
        failures.commit()
        if dataset is not None:
            _finish_dataset(dataset, directory, paths, save_parquet, private)
            dataset = None
    finally:
        samples.abort()
        failures.abort()
        if dataset is not None:
            dataset.abort()


def _export(rows: Iterable[tuple[Any, ...]], samples: _TempFile | None, failures: _TempFile | None,
            dataset: DatasetWriter | None, on_head: Callable[[dict[str, Any]], None] | None) -> None:
    """Write each row (:data:`~.store.RECORD`'s columns, then idx, episode_id, status and store) to the files
    given (None: not written), and give its head to ``on_head``."""
    heads = samples is not None or on_head is not None
    for head_text, rows_text, blob, _, _, status, _ in rows:
        if heads:
            head = codec.loads(head_text)
            if on_head is not None:
                on_head(head)
            if samples is not None and failures is not None:
                if status == "ok":
                    samples.write(_sample_lines(head))
                else:
                    failures.write(_failure_line(head))
        if dataset is not None and status == "ok" and rows_text:
            dataset.add(codec.loads(rows_text), blob)


def _finish_dataset(dataset: DatasetWriter, directory: Path, paths: list[Path], parquet: bool, private: bool) -> None:
    if dataset.stale:  # a later row called for another column: written again with every column
        dataset.abort()
        write_dataset(directory, paths, parquet=parquet, private=private)
    else:
        dataset.finish()


def write_dataset(directory: Path, paths: list[Path], *, parquet: bool = False, private: bool = True) -> None:
    """Write ``trajectories/`` (and ``trajectories.parquet``) from the stores ``paths`` (a second pass when a
    later row calls for another column)."""
    dataset = DatasetWriter(directory, parquet=parquet, private=private)
    try:
        for _ in range(2):
            for rows_text, blob, *_ in ordered_rows(paths, columns="CAST(rows AS BLOB), tokens",
                                                    where="WHERE status = 'ok'"):
                if rows_text:
                    dataset.add(codec.loads(rows_text), blob)
            if not dataset.stale:
                break
            dataset = dataset.restart()
        dataset.finish()
    except BaseException:
        dataset.abort()
        raise


#: How long the export's process may take once told to finish: this much, plus PER_EPISODE_S per episode
#: (hundreds of times the need).
BASE_TIMEOUT_S = 300.0
PER_EPISODE_S = 0.01


#: The export's process writes the rows a mark makes final once there are this many (fewer, larger reads), at
#: this niceness (the run's own threads come first).
FOLLOW_ROWS = 1024
FOLLOW_NICE = 10
#: Seconds a process told to stop has to remove what it began before it is killed.
KILL_AFTER_S = 5.0
#: The child's program (not ``-m``: the package imports this module before ``-m`` would run it again).
_CHILD = f"import sys; from {__name__} import main; sys.exit(main())"


class ExportProcess:
    """A fresh interpreter of its own (:func:`main`) writing ``samples.jsonl``, ``failures.jsonl`` and (with
    ``dataset``) the dataset from the stores ``paths``: the rows :meth:`mark` says are final as the run goes on
    (so that little is left at its end), the rest once told the run is over (:meth:`end`)."""

    def __init__(self, directory: Path, paths: list[Path], *, dataset: bool, parquet: bool, private: bool):
        self.paths = paths
        self.ended: subprocess.Popen[bytes] | None = None
        self.timeout = BASE_TIMEOUT_S
        plan = {"directory": str(directory), "paths": [str(p) for p in paths], "dataset": dataset,
                "parquet": parquet, "private": private, "step": FOLLOW_ROWS}
        self.errors = tempfile.TemporaryFile()  # not a pipe: a process that says much never waits on it
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.errors)
        assert self.proc.stdin is not None
        self.input = self.proc.stdin.fileno()
        os.set_blocking(self.input, False)  # a mark never waits for the process
        self._send(json.dumps(plan) + "\n", BASE_TIMEOUT_S)

    def _send(self, line: str, timeout: float = 0.0) -> bool:
        """Write ``line``, waiting up to ``timeout`` for room (a mark, shorter than PIPE_BUF, is written whole or
        not at all; the plan may take several writes)."""
        deadline = time.monotonic() + timeout
        data = line.encode()
        while self.proc is not None:
            try:
                data = data[os.write(self.input, data):]
                if not data:
                    return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                select.select([], [self.input], [], max(0.0, deadline - time.monotonic()))
            except OSError:  # the process is gone: wait() says so
                return False
        return False

    def mark(self, index: int) -> None:
        """Every episode of index below ``index`` is in the store for good: the process may write them now (a
        mark the process has no room for yet is dropped: a later one covers it)."""
        self._send(f"{index}\n")

    def end(self) -> None:
        """Let the process write the rest (and put its files in place): the run is over."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None
        self.timeout = BASE_TIMEOUT_S + PER_EPISODE_S * sum(map(count_episodes, self.paths))
        self._send("end\n", self.timeout)
        self.proc, self.ended = None, proc
        proc.stdin.close()

    def wait(self) -> bool:
        """Wait for the process :meth:`end` ended: whether it wrote its files (else it is killed, and why it
        failed is logged)."""
        proc = self.ended
        assert proc is not None
        try:
            proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
            log.warning("the process exporting the run did not finish in time; exporting it here")
            return False
        finally:
            self.errors.seek(0)
            err = self.errors.read()
            self.errors.close()
        if proc.returncode != 0:
            tail = err.decode("utf-8", errors="replace").strip().splitlines()[-1:] or [""]
            log.warning("the process exporting the run failed (exit status %s: %s); exporting it here",
                        proc.returncode, tail[0])
            return False
        return True

    def kill(self) -> None:
        """Stop the process: before :meth:`end`, its files are not written (it removes what it began, unless
        it is slow to stop)."""
        proc, self.proc, self.ended = self.proc or self.ended, None, None
        if proc is not None:
            try:
                proc.communicate(timeout=KILL_AFTER_S)  # its input closed: it stops at its next read
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
            self.errors.close()


def main() -> int:
    """The export's process: its plan (a JSON object: directory, paths, dataset, parquet, private, step) is the
    first line of its input; each further line an index (the episodes below it are final: written now),
    then ``end`` (the rest, then the files are put in place). Input that ends without ``end`` keeps nothing."""
    plan = json.loads(sys.stdin.readline())
    os.nice(FOLLOW_NICE)  # the run's own threads come first
    directory, paths, private = Path(plan["directory"]), [Path(p) for p in plan["paths"]], plan["private"]
    samples, failures = _TempFile(directory, SAMPLES, private), _TempFile(directory, FAILURES, private)
    dataset = DatasetWriter(directory, parquet=plan["parquet"], private=private) if plan["dataset"] else None
    low = None
    try:
        for line in sys.stdin:
            high = None if line.strip() == "end" else int(line)
            if high is not None and high - (low or 0) < plan["step"]:
                continue  # written with the next mark: fewer, larger reads
            bounds = [f"idx >= {low}"] * (low is not None) + [f"idx < {high}"] * (high is not None)
            _export(ordered_rows(paths, where=" AND ".join(["WHERE 1", *bounds])), samples, failures, dataset, None)
            if high is None:
                break
            samples.fh.flush()  # what is written is seen (a reader can follow the run's progress)
            failures.fh.flush()
            low = high
        else:
            return 1
        samples.commit()
        failures.commit()
        if dataset is not None:
            _finish_dataset(dataset, directory, paths, plan["parquet"], private)
            dataset = None
        return 0
    finally:
        samples.abort()
        failures.abort()
        if dataset is not None:
            dataset.abort()


def _failure_line(head: dict[str, Any]) -> bytes:
    return _line({k: head.get(k) for k in ("episode_id", "index", "error_component", "error", "attempts", "answer")})


def _line(value: dict[str, Any]) -> bytes:
    """:func:`codec.dumps_compact` of a line and its end, without orjson's read-back of the JSON when no value
    is a NaN or infinity (orjson writes those as null)."""
    data = codec.dumps_finite(value) if codec.values_finite(value.values()) else None
    return (data if data is not None else codec.dumps_compact(value)) + b"\n"


def _sample_lines(head: dict[str, Any]) -> bytes:
    chosen = head.get("chosen")
    eid, prompt, answer = head["episode_id"], head["prompt"], head["answer"]
    lines = [_line({
        "episode_id": eid, "sample_index": s["sample_index"], "prompt": prompt, "response": s["response"],
        "answer": answer, "extracted": s["extracted"], "reward": s["reward"], "reason": s["reason"],
        "finish_reason": s["finish_reason"], "generated_tokens": s["generated_tokens"],
        "chosen": chosen == s["sample_index"] if chosen is not None else None,
        **({"turn_rewards": s["turn_rewards"]} if "turn_rewards" in s else {}),
    }) for s in head["samples"]]
    return b"".join(lines)


class _TempFile:
    """A new file with a unique name starting with ``.name.`` (created exclusively: never an existing file or
    link), 0600 unless shared; renamed over ``name`` by :meth:`commit`."""

    def __init__(self, directory: Path, name: str, private: bool):
        self.target = Path(directory) / name
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
        if not private:
            os.fchmod(fd, file_mode(False))
        self.path: Path | None = Path(tmp)
        self.fh: IO[bytes] = os.fdopen(fd, "wb", buffering=1 << 20)
        self.write = self.fh.write

    def commit(self) -> None:
        self.fh.close()
        assert self.path is not None
        os.replace(self.path, self.target)
        self.path = None

    def abort(self) -> None:
        self.fh.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


# -- the dataset ---------------------------------------------------------------------------------------
class DatasetWriter:
    """Writes training rows (``[fields, columns]`` pairs of the store, with their episode's token blob) to
    ``trajectories/`` (and, with ``parquet``, ``trajectories.parquet``), a chunk at a time, via temp names.

    Its columns are the standard ones plus ``kinds`` when given, else plus those of the rows of its first
    chunk; a later row that calls for other columns (a new key, a wider type) makes it :attr:`stale`: it
    stops writing, and :meth:`restart` begins again with every column seen."""

    def __init__(self, directory: Path, kinds: Mapping[str, str] | None = None, *, parquet: bool = False,
                 private: bool = True):
        self.directory = Path(directory)
        self.private = private
        self.parquet = parquet
        self.seen = ExtraColumns(STANDARD_KINDS)
        self.kinds: dict[str, str] | None = None if kinds is None else {**STANDARD_KINDS, **kinds}
        self.stale = False
        self.tmp = fresh_dir(self.directory, DATASET, private=private)
        self._chunk: list[tuple[dict[str, Any], dict[str, Any], bytes]] = []
        self._tokens = 0
        self._shards: list[Path] = []
        self._stream: Any = None
        self._sink: Any = None
        self._shard_bytes = 0
        self._parquet: Any = None
        self._pending: list[Any] = []  # batches for the next row group of the Parquet file
        self._pending_rows = 0
        # Row groups are compressed and written on a thread of their own (pyarrow releases the GIL), one at a
        # time: the next chunks are built meanwhile.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="scaffold-parquet")
        self._group: Future[None] | None = None

    def add(self, rows: list[Any], blob: bytes | None) -> None:
        for fields, columns in rows:
            if self.seen.add(fields) and self.kinds is not None and not self.stale:
                self.stale = {**self.kinds, **self.seen.kinds()} != self.kinds
            if self.stale:
                continue
            self._chunk.append((fields, columns, blob or b""))
            ids = columns.get("input_ids")
            self._tokens += token_count(ids) if ids is not None else len(fields.get("input_ids") or ())
            if len(self._chunk) >= CHUNK_ROWS or self._tokens >= CHUNK_TOKENS:
                self._flush()

    def _flush(self) -> None:
        if self.kinds is None:  # the first chunk decides the extra columns
            self.kinds = {**STANDARD_KINDS, **self.seen.kinds()}
        if not self._chunk or self.stale:
            self._chunk = []
            return
        chunk, self._chunk, self._tokens = self._chunk, [], 0
        self._write(build_batch(chunk, self.kinds))

    def _write(self, batch: Any) -> None:
        import pyarrow as pa

        if self._stream is not None and self._shard_bytes >= MAX_SHARD_BYTES:
            self._close_shard()
        if self._stream is None:
            path = self.tmp / f"data-{len(self._shards):05d}.arrow"
            self._shards.append(path)
            self._sink = pa.OSFile(str(path), "wb")
            self._stream = pa.ipc.new_stream(self._sink, batch.schema)
            self._shard_bytes = 0
        self._stream.write_batch(batch)
        self._shard_bytes += batch.nbytes
        if self.parquet:
            self._pending.append(batch)
            self._pending_rows += batch.num_rows
            if self._pending_rows >= PARQUET_ROWS:
                self._write_row_group()

    def _write_row_group(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending)
        self._pending, self._pending_rows = [], 0
        self._wait_group()
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(str(self.tmp / PARQUET), table.schema, compression="zstd")
        self._group = self._pool.submit(self._parquet.write_table, table, row_group_size=max(1, len(table)))

    def _wait_group(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.result()

    def _close_shard(self) -> None:
        if self._stream is not None:
            try:
                self._stream.close()
            finally:
                self._sink.close()
                self._stream = self._sink = None

    def restart(self) -> DatasetWriter:
        """A new writer for the same directory with every column seen so far."""
        kinds = self.seen.kinds()
        self.abort()
        return DatasetWriter(self.directory, kinds, parquet=self.parquet, private=self.private)

    def finish(self) -> None:
        """Complete the dataset and the Parquet file and put them in place (replacing earlier ones)."""
        self._flush()
        if self.stale:
            raise ValueError("the dataset's columns changed after its first chunk: restart() it")
        if not self._shards:  # datasets cannot load a dataset of no shards: write one empty shard
            self._write(build_batch([], self.kinds or STANDARD_KINDS))
        self._close_shard()
        self._write_row_group()
        self._wait_group()
        self._pool.shutdown()
        if self._parquet is not None:
            self._parquet.close()
        count = len(self._shards)
        names = []
        for i, shard in enumerate(self._shards):
            name = f"data-{i:05d}-of-{count:05d}.arrow"
            os.replace(shard, self.tmp / name)
            names.append(name)
        write_dataset_files(self.tmp, self.kinds or STANDARD_KINDS, names)
        set_tree_modes(self.tmp, private=self.private)
        if self.parquet:
            os.replace(self.tmp / PARQUET, self.directory / PARQUET)
        replace_dir(self.tmp, self.directory / DATASET)

    def abort(self) -> None:
        """Drop what was written (the temp folder)."""
        try:
            self._close_shard()
            self._pool.shutdown(cancel_futures=True)
            if self._parquet is not None:
                self._parquet.close()
        finally:
            self._chunk = self._pending = []
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


# -- columns -------------------------------------------------------------------------------------------
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
    """The keys rows carry beyond ``known`` and the dataset types of their values, row by row."""

    def __init__(self, known: Iterable[str]):
        self.known = set(known)
        self.found: dict[str, set[str | None]] = {}

    def add(self, row: Mapping[str, Any]) -> bool:
        """Note the row's extra keys; whether it had any."""
        if row.keys() <= self.known:
            return False
        for key, value in row.items():
            if key not in self.known and value is not None:
                self.found.setdefault(key, set()).add(OPTIONAL_KINDS.get(key) or _value_type(value))
        return True

    def kinds(self) -> dict[str, str]:
        """The columns the keys found call for: numbers, strings, booleans and lists of numbers (other values
        stay in the store only)."""
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


def datasets_feature(kind: str) -> Any:
    import datasets

    if kind.startswith("list:"):
        return datasets.Sequence(datasets.Value(kind[5:]))
    return datasets.Value(kind)


def trajectory_features() -> Any:
    """The standard columns of the trajectories dataset (``datasets.Features``)."""
    import datasets

    return datasets.Features({name: datasets_feature(kind) for name, kind in STANDARD_KINDS.items()})


def arrow_type(kind: str) -> Any:
    import pyarrow as pa

    scalar = {"bool": pa.bool_(), "int64": pa.int64(), "int32": pa.int32(), "int8": pa.int8(),
              "float32": pa.float32(), "string": pa.string()}
    return pa.list_(scalar[kind[5:]]) if kind.startswith("list:") else scalar[kind]


def feature_dict(kind: str) -> dict[str, Any]:
    """The column as ``datasets`` describes it in dataset_info.json (every release since 2.x reads it)."""
    if kind.startswith("list:"):
        return {"feature": {"dtype": kind[5:], "_type": "Value"}, "_type": "Sequence"}
    return {"dtype": kind, "_type": "Value"}


def dataset_schema(kinds: Mapping[str, str]) -> Any:
    """The Arrow schema of the dataset, with the features ``datasets`` keeps in its metadata."""
    import pyarrow as pa

    features = {name: feature_dict(kind) for name, kind in kinds.items()}
    return pa.schema([(name, arrow_type(kind)) for name, kind in kinds.items()],
                     metadata={"huggingface": json.dumps({"info": {"features": features}})})


def build_batch(chunk: list[tuple[dict[str, Any], dict[str, Any], bytes]], kinds: Mapping[str, str]) -> Any:
    """The rows as one Arrow RecordBatch with the columns ``kinds``: the values ``Dataset.from_dict`` gives.

    Arrays are made from buffers of Arrow's own memory (``Array.from_buffers``): ``pa.array`` imports
    pandas (half a second) to check its argument, and the IPC writer writes a buffer that is not 64-byte
    aligned many times slower."""
    import pyarrow as pa

    arrays = []
    for name, kind in kinds.items():
        column = None
        if name in TOKEN_COLUMNS and kind.startswith("list:"):
            column = _token_column(chunk, name, kind[5:])
        if column is None:
            values = [column_values(cols[name], blob) if name in cols else fields.get(name)
                      for fields, cols, blob in chunk]
            column = _python_column(values, name, kind)
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, schema=dataset_schema(kinds))


_NUMPY = {"int64": "<i8", "int32": "<i4", "int8": "|i1", "float32": "<f4"}
_STRUCT = {"int64": "q", "int32": "i", "int8": "b", "float32": "f"}


def _token_column(chunk: list[tuple[dict[str, Any], dict[str, Any], bytes]], name: str, kind: str) -> Any:
    """A list column from the rows' encoded segments with a few numpy calls per chunk (no Python value per
    token), or None when some row has the column otherwise (not encoded, missing, kept as JSON)."""
    import numpy as np
    import pyarrow as pa

    counts: list[int] = []
    fills: list[Any] = []
    sources: list[str | None] = []  # per segment: the dtype of an array, None for a run
    arrays: dict[str, list[Any]] = {}
    offsets = [0]
    total = 0
    for _, cols, blob in chunk:
        segments = cols.get(name)
        if segments is None:
            return None
        for seg in segments:
            code, n = seg[0], seg[-1]
            if code == "run":
                fills.append(seg[1])
                sources.append(None)
            elif code == "json":
                return None
            else:
                at = seg[1]
                arrays.setdefault(code, []).append(memoryview(blob)[at:at + n * np.dtype(code).itemsize])
                fills.append(0)
                sources.append(code)
            counts.append(n)
            total += n
        offsets.append(total)
    target = _NUMPY[kind]
    buffer = pa.allocate_buffer(total * np.dtype(target).itemsize)
    out = np.frombuffer(buffer, dtype=target)  # written in place: Arrow's own memory (see _aligned)
    try:
        if len(arrays) == 1 and None not in sources:  # arrays of one dtype only (input_ids): cast into place
            dtype, pieces = next(iter(arrays.items()))
            out[:] = _converted(np.frombuffer(b"".join(pieces), dtype=dtype), target)
        else:  # the runs, then the arrays put in their places
            out[:] = np.repeat(_numbers(fills, target), counts)
            for dtype, pieces in arrays.items():
                where = np.repeat(np.fromiter((s == dtype for s in sources), bool, len(sources)), counts)
                out[where] = _converted(np.frombuffer(b"".join(pieces), dtype=dtype), target)
    except (TypeError, ValueError, OverflowError):  # a value the column cannot hold: as datasets converts it
        return None
    value_type = arrow_type(kind)
    values = pa.Array.from_buffers(value_type, total, [None, buffer])
    return pa.Array.from_buffers(pa.list_(value_type), len(chunk),
                                 [None, _aligned(struct.pack(f"<{len(offsets)}i", *offsets))], children=[values])


def _numbers(values: list[Any], target: str) -> Any:
    """Python numbers as a numpy array of ``target``; an integer it cannot hold raises OverflowError."""
    import numpy as np

    out = np.array(values, dtype=target)
    if out.dtype.kind in "iu" and len(values) and out.tolist() != values:
        raise OverflowError(f"a value does not fit {target}")
    return out


def _converted(data: Any, target: str) -> Any:
    """Array values as ``target`` (a value ``target`` cannot hold raises OverflowError, as pyarrow raises
    converting such a value)."""
    import numpy as np

    if data.dtype == np.dtype(target):
        return data
    out = data.astype(target)
    if out.dtype.kind in "iu" and not np.can_cast(data.dtype, out.dtype) and (out != data).any():
        raise OverflowError(f"a value does not fit {target}")
    return out


def _aligned(data: bytes) -> Any:
    """``data`` in a buffer of Arrow's own (64-byte aligned) memory."""
    import numpy as np
    import pyarrow as pa

    buffer = pa.allocate_buffer(len(data))
    if data:
        np.frombuffer(buffer, dtype=np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
    return buffer


_PYTHON_TYPES = {"bool": bool, "string": str, "int64": int, "int32": int, "int8": int, "float32": float}


def _python_column(values: list[Any], name: str, kind: str) -> Any:
    """A column from Python values: as they are when each is of the column's exact type (a list: its first
    element, as ``datasets`` checks), else through ``datasets``' encoding."""
    import pyarrow as pa

    is_list = kind.startswith("list:")
    python = _PYTHON_TYPES[kind[5:] if is_list else kind]
    plain = True
    nulls = False
    for value in values:
        if value is None:
            nulls = True
            continue
        if is_list:
            if type(value) is not list or (value and type(value[0]) is not python):
                plain = False
                break
        elif type(value) is not python:
            plain = False
            break
    if plain:
        if not nulls and not is_list:
            column = _scalar_column(values, kind)
            if column is not None:
                return column
        return pa.array(values, type=arrow_type(kind))
    from datasets.arrow_writer import OptimizedTypedSequence
    from datasets.features import Features

    feature = datasets_feature(kind)
    encoded = Features({name: feature}).encode_column(values, name)
    return pa.array(OptimizedTypedSequence(encoded, type=feature, col=name)).cast(arrow_type(kind))


def _scalar_column(values: list[Any], kind: str) -> Any:
    """Numbers or strings of the column's exact type, none missing, as an Arrow array; None to leave them
    to ``pa.array`` (a number out of range, a string that is not UTF-8, booleans)."""
    import pyarrow as pa

    n = len(values)
    try:
        if kind == "string":
            data = [v.encode("utf-8") for v in values]
            ends = list(accumulate(map(len, data), initial=0))
            if ends[-1] >= 1 << 31:
                return None
            return pa.Array.from_buffers(pa.string(), n, [None, _aligned(struct.pack(f"<{n + 1}i", *ends)),
                                                          _aligned(b"".join(data))])
        code = _STRUCT.get(kind)
        if code is None:
            return None
        return pa.Array.from_buffers(arrow_type(kind), n, [None, _aligned(struct.pack(f"<{n}{code}", *values))])
    except (UnicodeEncodeError, struct.error, OverflowError):
        return None
