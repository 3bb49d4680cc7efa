"""The run's store: every finished episode in an SQLite database, ``episodes.db`` in the output directory.

One row per episode (the ``episodes`` table, see :mod:`.migrations`) holds its
latest record: its head (status, error, prompt, answers, samples, metrics, as
JSON text), its training sequences, and their token arrays, encoded exactly by
:mod:`.tokens`. A run writes the episodes that finish in one step of its event
loop in one transaction (the database is in WAL mode), so a killed run keeps
every step written before the kill and nothing of the one in flight; an
episode written again (a failed one retried on ``--resume``) replaces its row
unless the row holds a completed episode and the new one failed (:data:`UPSERT`).

Each worker of a multi-worker run writes a store of its own
(``episodes.rank-NNNNN.db``, see scaffold_core.launch); the run's end merges them
into ``episodes.db`` by the same rule (:func:`merge_stores`). Read a run with
:func:`read_records` (every record, token arrays as lists),
:class:`~scaffold_core.output.reader.EpisodeReader` (records in
``(index, episode_id)`` order, in bounded memory) or with any SQLite client::

    sqlite3 runs/x/episodes.db "SELECT json_extract(head, '$.final_answer') FROM episodes WHERE status = 'ok'"
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..episode import EpisodeResult, Sample
from ..errors import RunDirError
from ..trajectory import TrainingSample
from ..verifier import Verdict
from . import codec
from .files import file_mode, open_nofollow, refuse_link
from .migrations import NewerStore, migrate
from .tokens import column_values, encode_columns

log = logging.getLogger("scaffold.output")

STORE = "episodes.db"
#: The stores of a multi-worker run's workers: ``episodes.rank-00003.db`` (merged into STORE at its end).
RANK_STORE_GLOB = "episodes.rank-*.db"
#: Files SQLite keeps beside a database while it is open (or after a process holding it was killed).
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")

_COLUMNS = "episode_id, idx, status, head, rows, tokens"
#: What a merge copies: every column (``teacher_kl`` is written apart, see EpisodeStore.put).
_MERGED = _COLUMNS + ", teacher_kl"
#: A completed episode beats a failed one; otherwise the latest record of an episode wins.
_ON_CONFLICT = """
    ON CONFLICT (episode_id) DO UPDATE SET idx = excluded.idx, status = excluded.status, head = excluded.head,
        rows = excluded.rows, tokens = excluded.tokens, teacher_kl = excluded.teacher_kl
    WHERE excluded.status = 'ok' OR episodes.status != 'ok'"""
#: (JSON given as UTF-8 bytes is kept as text: CAST reads the bytes as they are.) ``teacher_kl`` is left NULL,
#: then set by :data:`SET_TEACHER_KL` for an episode a teacher scored.
UPSERT = (f"INSERT INTO episodes ({_COLUMNS}) VALUES (?, ?, ?, CAST(? AS TEXT), CAST(? AS TEXT), ?) "
          f"{_ON_CONFLICT}")
SET_TEACHER_KL = "UPDATE episodes SET teacher_kl = ? WHERE episode_id = ? AND status = ?"
#: The columns of a whole record, its JSON as bytes (read without decoding it to text first).
RECORD = "CAST(head AS BLOB), CAST(rows AS BLOB), tokens"
#: Seconds between checkpoints of a writer's WAL (see EpisodeStore).
CHECKPOINT_S = 0.5
#: How long a connection waits for another's lock (a reader checkpointing, a merge) before it fails.
BUSY_TIMEOUT_MS = 30_000


def rank_store_name(rank: int) -> str:
    """The store of worker ``rank`` in a multi-worker run."""
    return f"episodes.rank-{rank:05d}.db"


def store_paths(directory: str | Path) -> list[Path]:
    """Every store of the run in ``directory``: ``episodes.db`` and the workers' stores, in rank order."""
    root = Path(directory)
    paths = [root / STORE] if os.path.lexists(root / STORE) else []
    return paths + sorted(root.glob(RANK_STORE_GLOB))


@contextmanager
def store_errors(path: Path) -> Iterator[None]:
    """SQLite's errors about ``path`` as one-line RunDirErrors naming it and the fix."""
    try:
        yield
    except NewerStore as exc:
        raise RunDirError(f"{path}: written by a newer scaffold (schema migrations {exc}); upgrade scaffold to read "
                          "it", path=str(path)) from None
    except sqlite3.DatabaseError as exc:
        raise RunDirError(f"{path}: the run's episode store cannot be read ({exc}); restore it from a copy, or move "
                          "it away and --resume (its episodes run again)", path=str(path)) from None


def connect(path: Path, *, create: bool = False, private: bool = True) -> sqlite3.Connection:
    """An autocommit connection to the store at ``path``, in WAL mode, its schema brought up to date.

    ``create``: make the file when missing (0600 unless not ``private``; SQLite gives its side files the
    same mode). A link at the store or at a side file is refused (RunDirError), never followed."""
    path = Path(path)
    for name in (path, *(path.with_name(path.name + s) for s in SIDE_SUFFIXES)):
        refuse_link(name)
    if not os.path.lexists(path):
        if not create:
            raise RunDirError(f"{path}: no such episode store", path=str(path))
        os.close(open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode(private)))
    with store_errors(path):
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")  # in WAL mode: a committed step survives a killed process
            migrate(db)
        except BaseException:
            db.close()
            raise
    return db


# -- records -------------------------------------------------------------------------------------------
def record_of(result: EpisodeResult) -> dict[str, Any]:
    """The record of one episode, as the store gives it back (token arrays as lists)."""
    return {**head_of(result), "trajectories": [_fields(t) for t in result.trajectories]}


def head_of(result: EpisodeResult) -> dict[str, Any]:
    """An episode's record without its training sequences."""
    samples = []
    for s in result.samples:
        v = s.verdict
        samples.append({
            "sample_index": s.sample_index,
            "response": s.text,
            "extracted": v.extracted if v else None,
            "key": v.key if v else None,
            "reward": v.reward if v else None,
            "reason": v.reason if v else None,
            **({"verdict_metrics": dict(v.metrics)} if v is not None and v.metrics else {}),
            "finish_reason": s.finish_reason,
            "prompt_tokens": len(s.prompt_ids),
            "generated_tokens": s.generated_tokens,
            "weight_version": s.weight_version,
            **({"turn_rewards": s.turn_rewards} if s.turn_rewards is not None else {}),
            **({"rollout": s.rollout} if s.rollout is not None else {}),
            **({"metadata": s.metadata} if s.metadata else {}),
        })
    return {
        "episode_id": result.episode_id,
        "index": result.index,
        "status": result.status,
        "error": result.error,
        "error_component": result.error_component,
        "attempts": result.attempts,
        "wall_s": round(result.wall_s, 6),
        "prompt": result.prompt_text,
        "answer": result.reference,
        "final_answer": result.answer,
        "answer_reward": result.answer_reward,
        "chosen": result.chosen,
        "metrics": result.metrics,
        "samples": samples,
        **({"started_s": result.started_s, "spans": result.spans} if result.spans is not None else {}),
    }


_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _fields(sequence: Any) -> dict[str, Any]:
    """A training sequence's fields (its ``to_dict``; read straight from the fields of a plain dataclass,
    without ``asdict``'s deep copy of the token lists)."""
    cls = type(sequence)
    names = _FIELDS.get(cls, ())
    if names == ():
        plain = issubclass(cls, TrainingSample) and cls.to_dict is TrainingSample.to_dict
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls)) if plain else None
    return {n: getattr(sequence, n) for n in names} if names is not None else sequence.to_dict()


def entry(result: EpisodeResult) -> tuple[Any, ...]:
    """The row of one episode: the parameters of :data:`UPSERT`."""
    blob = bytearray()
    rows = []
    finite = True  # no NaN or infinity among the fields (the segments hold none)
    for sequence in result.trajectories:
        fields = _fields(sequence)
        try:
            columns = encode_columns(fields, blob)
        except TypeError:  # a token column that is not a list: kept in the JSON as it is
            columns = {}
        fields.update(dict.fromkeys(columns, 0))  # placeholders: the columns keep their place among the fields
        finite = finite and codec.values_finite(fields.values())
        rows.append([fields, columns])
    head = head_of(result)
    spans = head.pop("spans", None)  # finite by construction (EpisodeResult.spans): not walked again
    head_finite = codec.values_finite(head.values())
    if spans is not None:
        head["spans"] = spans  # the last field, as head_of puts it
    return (result.episode_id, result.index, result.status, _dumps(head, head_finite),
            _dumps(rows, finite) if rows else None, bytes(blob) if blob else None)


def teacher_kl(result: EpisodeResult) -> float | None:
    """The episode's teacher-student KL (the store's ``teacher_kl``): the mean over the tokens its training
    sequences generated (loss mask 1) of ``logprob - teacher_logprob``; None when no sequence has teacher
    logprobs (or they are not lists of numbers)."""
    total, count = 0.0, 0
    for sequence in result.trajectories:
        teacher = getattr(sequence, "teacher_logprobs", None)
        if teacher is None:
            continue
        try:
            for m, s, t in zip(sequence.loss_mask, sequence.logprobs, teacher):
                if m:
                    total += s - t
                    count += 1
        except TypeError:
            return None
    return total / count if count else None


def _dumps(value: Any, finite: bool | None = None) -> bytes:
    """:func:`codec.dumps_compact` without orjson's read-back of the JSON (done when a null it wrote may be a
    NaN) when ``value`` (a record's head: its top-level values walked here; else ``finite`` says) holds no NaN
    or infinity."""
    if finite is None:
        finite = codec.values_finite(value.values())
    data = codec.dumps_finite(value) if finite else None
    return data if data is not None else codec.dumps_compact(value)


def decode(head: str | bytes, rows: str | bytes | None, blob: bytes | None) -> dict[str, Any]:
    """A whole record from its row: the head with its ``trajectories``, token arrays as lists."""
    record = codec.loads(head)
    sequences = []
    for fields, columns in codec.loads(rows) if rows else ():
        for name, segments in columns.items():
            fields[name] = column_values(segments, blob or b"")
        sequences.append(fields)
    record["trajectories"] = sequences
    return record


def result_of(record: dict[str, Any]) -> EpisodeResult:
    """A light EpisodeResult rebuilt from a record or its head (enough for metrics)."""
    samples = []
    for s in record.get("samples", []):
        verdict = None if s.get("reward") is None else Verdict(s["reward"], s.get("extracted"), s.get("key"),
                                                               s.get("reason") or "", s.get("verdict_metrics"))
        n = int(s.get("generated_tokens", 0))  # a mask of n generated tokens: what the metrics count
        samples.append(Sample([], [], [], [1] * n, s.get("response", ""), s.get("finish_reason", ""),
                              s.get("sample_index", 0), s.get("weight_version"), verdict, rollout=s.get("rollout")))
    return EpisodeResult(
        episode_id=record["episode_id"], index=record.get("index", 0), status=record["status"],
        reference=record.get("answer"), samples=samples, chosen=record.get("chosen"),
        answer=record.get("final_answer"), answer_reward=record.get("answer_reward"),
        metrics=record.get("metrics") or {}, error=record.get("error"),
        error_component=record.get("error_component"), attempts=record.get("attempts", 1),
        wall_s=float(record.get("wall_s") or 0.0), spans=record.get("spans"), started_s=record.get("started_s"),
    )


# -- writing -------------------------------------------------------------------------------------------
class EpisodeStore:
    """One process's writer of one store: :meth:`put` writes the episodes given in one transaction."""

    def __init__(self, path: Path, *, private: bool = True):
        self.path = Path(path)
        self.db = connect(self.path, create=True, private=private)
        # The WAL is folded into the database (a checkpoint: copied, then synced) on a thread of its own, so
        # the run never waits for it: SQLite's calls leave the GIL.
        self.db.execute("PRAGMA wal_autocheckpoint = 0")
        self._stop = threading.Event()
        self._checkpoints = threading.Thread(target=self._checkpoint, name="scaffold-store-checkpoint", daemon=True)
        self._checkpoints.start()

    def _checkpoint(self) -> None:
        db = connect(self.path)
        try:
            while not self._stop.wait(CHECKPOINT_S):
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # the writer's commits go on; the WAL is folded in when the store closes
            log.warning("checkpointing %s failed (%s: %s)", self.path, type(exc).__name__, exc)
        finally:
            db.close()

    def put(self, results: Iterable[EpisodeResult]) -> None:
        """Record ``results`` together: all of them, or (on an error) none."""
        results = list(results)
        rows = [entry(r) for r in results]
        kls = [(kl, r.episode_id, r.status) for r in results if (kl := teacher_kl(r)) is not None]
        if rows:
            self._write(rows, kls)

    def _write(self, rows: list[tuple[Any, ...]], kls: Sequence[tuple[Any, ...]] = ()) -> None:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(UPSERT, rows)
            if kls:
                db.executemany(SET_TEACHER_KL, kls)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM episodes").fetchone()[0])

    def close(self) -> None:
        """Close the store (the last connection to close folds the WAL into the database file)."""
        self._stop.set()
        self._checkpoints.join(timeout=BUSY_TIMEOUT_MS / 1000)
        self.db.close()


# -- reading -------------------------------------------------------------------------------------------
class StoreReader:
    """Reads one store (a connection of its own; use as a context manager)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.db = connect(self.path)

    def count(self) -> int:
        with store_errors(self.path):
            return int(self.db.execute("SELECT count(*) FROM episodes").fetchone()[0])

    def rows(self, order: str = "idx, episode_id", where: str = "", columns: str = RECORD
             ) -> Iterator[tuple[Any, ...]]:
        """Raw rows (``columns``, then ``idx``, ``episode_id`` and ``status``) in ``order``."""
        query = f"SELECT {columns}, idx, episode_id, status FROM episodes {where} ORDER BY {order}"
        with store_errors(self.path):
            yield from self.db.execute(query)

    def completed_ids(self) -> set[str]:
        with store_errors(self.path):
            return {eid for (eid,) in self.db.execute("SELECT episode_id FROM episodes WHERE status = 'ok'")}

    def record(self, seq: int) -> dict[str, Any]:
        with store_errors(self.path):
            row = self.db.execute(f"SELECT {RECORD} FROM episodes WHERE seq = ?", (seq,)).fetchone()
        if row is None:
            raise RunDirError(f"{self.path}: episode row {seq} is gone (the store changed while it was read); "
                              "read it again", path=str(self.path))
        return decode(*row)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ordered_rows(paths: list[Path], columns: str = RECORD, where: str = ""
                 ) -> Iterator[tuple[Any, ...]]:
    """Every episode's row across the stores ``paths``, in ``(index, episode_id)`` order: (``columns``...,
    idx, episode_id, status, the number of its store in ``paths``). An episode in several stores (a run
    resumed with other workers, not merged yet) counts once, by the rule of :data:`UPSERT` (the later store
    wins among records of the same kind)."""
    readers = [StoreReader(p) for p in paths]
    try:
        if len(readers) == 1:
            for row in readers[0].rows(columns=columns, where=where):
                yield (*row, 0)
            return
        streams = [((row[-3], row[-2], i, (*row, i)) for row in reader.rows(columns=columns, where=where))
                   for i, reader in enumerate(readers)]
        last: tuple[Any, ...] | None = None
        for _, eid, _, row in heapq.merge(*streams):
            if last is not None and last[-3] == eid:
                if row[-2] == "ok" or last[-2] != "ok":
                    last = row
                continue
            if last is not None:
                yield last
            last = row
        if last is not None:
            yield last
    finally:
        for reader in readers:
            reader.close()


def read_records(directory: str | Path, *, ordered: bool = True) -> Iterator[dict[str, Any]]:
    """Every episode's record in the run in ``directory`` (token arrays as lists), in ``(index, episode_id)``
    order; ``ordered=False``: every record of every store as it is stored, duplicates across stores included."""
    paths = store_paths(directory)
    if ordered:
        for row in ordered_rows(paths):
            yield decode(*row[:3])
        return
    for path in paths:
        with StoreReader(path) as reader:
            for row in reader.rows(order="seq"):
                yield decode(*row[:3])


def completed_ids(paths: list[Path]) -> set[str]:
    """Ids of the episodes some store in ``paths`` records as completed."""
    done: set[str] = set()
    for path in paths:
        with StoreReader(path) as reader:
            done |= reader.completed_ids()
    return done


def count_episodes(path: Path) -> int:
    """How many episodes the store at ``path`` holds (0 for an empty file or one without the table yet);
    the store is not changed (no migration runs)."""
    if not os.path.lexists(path):
        return 0
    refuse_link(path)
    with store_errors(path):
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            return int(db.execute("SELECT count(*) FROM episodes").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return 0
            raise
        finally:
            db.close()


def merge_stores(directory: Path, *, private: bool = True, remove: bool = True) -> Path:
    """Fold the workers' stores into ``episodes.db`` (each in one transaction, by the rule of :data:`UPSERT`,
    in rank order), removing each once it is in (``remove=False``: left for the caller); the run's store.
    Safe to repeat after a kill: a store merged again changes nothing."""
    target = Path(directory) / STORE
    sources = sorted(Path(directory).glob(RANK_STORE_GLOB))
    db = connect(target, create=True, private=private)
    try:
        for source in sources:
            connect(source).close()  # its schema brought up to date, its WAL folded in
            with store_errors(source):
                db.execute("ATTACH DATABASE ? AS source", (str(source),))
                try:
                    db.execute("BEGIN IMMEDIATE")
                    db.execute(f"INSERT INTO main.episodes ({_MERGED}) SELECT {_MERGED} FROM source.episodes "
                               f"WHERE true ORDER BY seq {_ON_CONFLICT}")
                    db.execute("COMMIT")
                finally:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    db.execute("DETACH DATABASE source")
            if remove:
                remove_store(source)
    finally:
        db.close()
    return target


def remove_store(path: Path) -> None:
    """Delete a store and its side files (never through a link)."""
    for name in (path, *(path.with_name(path.name + s) for s in SIDE_SUFFIXES)):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
