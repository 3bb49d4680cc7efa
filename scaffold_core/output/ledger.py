"""The episode ledger: one JSON line per finished episode, appended as it finishes.

``episodes.jsonl`` (or ``episodes.rank-NNNNN.jsonl`` per worker of a
multi-worker run) holds every finished episode, completed or failed, with its
samples and training sequences. The sequences' token arrays are packed in
binary in the ledger's sidecar (``episodes.tokens.bin``, see
:mod:`scaffold_core.output.tokens`), appended just before the line that
names them (a run appends the episodes that finish in one step of its event
loop together, see :class:`~scaffold_core.output.rundir.RunOutput`). A killed
run loses at most the episodes in flight; ``--resume`` skips every completed
episode found in any ledger.

Read ledgers through :func:`read_ledger`, :func:`latest_records` and
:class:`~scaffold_core.output.ledger_index.LedgerIndex`: they give every
record with its token arrays as lists, whichever way its line stores them.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..episode import EpisodeResult, Sample
from ..trajectory import TrainingSample
from ..verifier import Verdict
from . import codec
from .files import open_nofollow
from .tokens import (
    TOKEN_COLUMNS,
    TOKENS_KEY,
    BadTokens,
    PackError,
    TokenFile,
    blob_ref,
    is_packed,
    pack_row,
    tokens_path,
    unpack_rows,
)

LEDGER = "episodes.jsonl"
#: Per-worker ledgers of multi-worker runs: ``episodes.rank-00003.jsonl`` (see scaffold_core.launch).
RANK_LEDGER_GLOB = "episodes.rank-*.jsonl"


def rank_ledger_name(rank: int) -> str:
    """The ledger file of worker ``rank`` in a multi-worker run."""
    return f"episodes.rank-{rank:05d}.jsonl"


def ledger_paths(directory: str | Path) -> list[Path]:
    """Every ledger of the run in ``directory``: ``episodes.jsonl`` and the rank ledgers, in rank order."""
    root = Path(directory)
    paths = [root / LEDGER] if (root / LEDGER).exists() else []
    return paths + sorted(root.glob(RANK_LEDGER_GLOB))


def record_of(result: EpisodeResult) -> dict[str, Any]:
    """The record of one episode, as :func:`read_ledger` gives it back (token arrays as lists)."""
    return _record(result, [t.to_dict() for t in result.trajectories])


def packed_entry(result: EpisodeResult, offset: int) -> tuple[bytes, bytes, dict[str, Any]]:
    """(ledger line, blob, record) of one episode whose blob goes at byte ``offset`` of the ledger's sidecar.

    The record is the line's content (token columns as segments of the blob). An episode without
    training sequences has an empty blob and a line with no ``tokens`` key; one whose token values do
    not pack (see :mod:`.tokens`) has the JSON-list line of :func:`ledger_line` and its record.
    """
    if not result.trajectories:
        record = _record(result, [])
        return codec.dumps_compact(record) + b"\n", b"", record
    pieces: list[bytes] = []
    at = 0
    rows = []
    packed = False
    finite = True  # no NaN or infinity in the rows (checked as they are made)
    try:
        for t in result.trajectories:
            names = _plain_fields(type(t))
            row = {n: getattr(t, n) for n in names} if names is not None else t.to_dict()
            specs, at = pack_row(row, row.get("prompt_len"), pieces, at)
            if specs:
                packed = True
                row = {**row, **specs}
            if finite:  # a plain sequence's other fields are read by one getter; any other row is walked
                finite = (codec.values_finite(_other_fields(type(t))(t)) and _fills_finite(specs.get("logprobs", ()))
                          if names is not None else _row_finite(row))
            rows.append(row)
    except PackError:
        return ledger_line(result), b"", record_of(result)
    blob = b"".join(pieces)
    record = _record(result, rows, tokens=[offset, len(blob), zlib.crc32(blob)] if packed else None)
    line = codec.dumps_finite(record) if finite and _head_finite(record) else None
    return (line if line is not None else codec.dumps_compact(record)) + b"\n", blob, record


def _head_finite(record: dict[str, Any]) -> bool:
    """Whether no float in a record made by :func:`packed_entry` is NaN or infinite, leaving out its
    ``trajectories`` (checked as they are made): the values where floats sit are tested, and only the
    containers whose content is not known (answers, metrics, metadata) are walked."""
    leaves = codec.LEAVES
    samples, rows = record["samples"], record["trajectories"]
    for value in record.values():
        kind = type(value)
        if kind in leaves:
            continue
        if kind is float:
            if value - value != 0.0:  # NaN and ±inf give NaN
                return False
        elif value is samples:
            for item in value:
                if not codec.values_finite(item.values()):
                    return False
        elif value is not rows and value and not codec.all_finite(value):
            return False
    return True


def _fills_finite(segments: Any) -> bool:
    """Whether no fill of a packed logprobs column is NaN or infinite (its only floats: arrays are bytes)."""
    for seg in segments:
        fill = seg.get("fill")
        if type(fill) is float and fill - fill != 0.0:
            return False
    return True


def _row_finite(row: dict[str, Any]) -> bool:
    """Whether no float of a packed training sequence is NaN or infinite: its integer columns' segments are
    not walked, and its logprobs' only floats are fills."""
    return _fills_finite(row.get("logprobs") or ()) and codec.values_finite(
        value for name, value in row.items() if name not in _PACKED)


#: The token columns, packed: segments (integer columns' hold integers only, ``_pack_ids``/``_int_runs`` take
#: nothing else; logprobs' hold floats only as fills).
_PACKED = frozenset(TOKEN_COLUMNS)
_OTHERS: dict[type, Any] = {}


def _other_fields(cls: type) -> Any:
    """A getter of the fields other than the token columns of a plain TrainingSample (sub)class (a tuple)."""
    getter = _OTHERS.get(cls)
    if getter is None:
        names = [n for n in _plain_fields(cls) or () if n not in _PACKED]
        getter = _OTHERS[cls] = (lambda t: (getattr(t, names[0]),)) if len(names) == 1 else operator.attrgetter(*names)
    return getter


def ledger_line(result: EpisodeResult) -> bytes:
    """The ledger line of one episode, encoded: ``record_of(result)`` as compact JSON and a newline.

    Training sequences are encoded straight from their fields (no copy of the
    token lists) with orjson; anything orjson would write differently from
    ``json`` takes the exact ``json`` path of :func:`record_of`.
    """
    parts = []
    for t in result.trajectories:
        names = _plain_fields(type(t))
        part = codec.fragment({n: getattr(t, n) for n in names} if names is not None else t.to_dict())
        if part is None:
            break
        parts.append(part)
    else:
        line = codec.dumps_fast(_record(result, parts))  # escapes the line breaks of the whole line, parts too
        if line is not None:
            return line + b"\n"
    return codec.dumps_compact(record_of(result)) + b"\n"


_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _plain_fields(cls: type) -> tuple[str, ...] | None:
    """Field names of a TrainingSample (sub)class whose ``to_dict`` is the dataclass one, else None."""
    try:
        return _FIELDS[cls]
    except KeyError:
        plain = issubclass(cls, TrainingSample) and cls.to_dict is TrainingSample.to_dict
        names = tuple(f.name for f in dataclasses.fields(cls)) if plain else None
        return _FIELDS.setdefault(cls, names)


def _record(result: EpisodeResult, trajectories: list[Any], tokens: list[int] | None = None) -> dict[str, Any]:
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
        **({TOKENS_KEY: tokens} if tokens is not None else {}),
        "trajectories": trajectories,
    }


def result_of(record: dict[str, Any]) -> EpisodeResult:
    """A light EpisodeResult rebuilt from a ledger line (enough for metrics)."""
    samples = []
    for s in record.get("samples", []):
        verdict = None if s.get("reward") is None else Verdict(s["reward"], s.get("extracted"), s.get("key"),
                                                               s.get("reason") or "", s.get("verdict_metrics"))
        n = int(s.get("generated_tokens", 0))
        samples.append(Sample([], [0] * n, [0.0] * n, [1] * n, s.get("response", ""), s.get("finish_reason", ""),
                              s.get("sample_index", 0), s.get("weight_version"), verdict, rollout=s.get("rollout")))
    return EpisodeResult(
        episode_id=record["episode_id"], index=record.get("index", 0), status=record["status"],
        reference=record.get("answer"), samples=samples, chosen=record.get("chosen"),
        answer=record.get("final_answer"), answer_reward=record.get("answer_reward"),
        metrics=record.get("metrics") or {}, error=record.get("error"),
        error_component=record.get("error_component"), attempts=record.get("attempts", 1),
    )


def read_ledger(path: Path, bad_lines: list[int] | None = None, *, tokens: bool = True,
                named: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """Ledger records, each with its token arrays as lists (``tokens=False``: as the line has them, the
    blob checked but not read into lists). A torn last line (the process died mid-write) is ignored, and
    so is a line that is not a record (garbage, not UTF-8, its blob missing or damaged): its number is
    appended to ``bad_lines``, and its episode is run again on resume. A link in place of the ledger or
    its sidecar is refused (RunDirError), never followed. ``named``: see :func:`read_packed`."""
    for record, blob in read_packed(path, bad_lines, named):
        yield with_token_lists(record, blob) if tokens else record


def read_packed(path: Path, bad_lines: list[int] | None = None, named: list[int] | None = None
                ) -> Iterator[tuple[dict[str, Any], bytes]]:
    """(record as its line has it, its checked blob or b"") per ledger record; the rules of :func:`read_ledger`.
    ``named``: its first item is raised to the end of the furthest blob any line names (a record or not)."""
    if not os.path.lexists(path):
        return
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as fh, TokenFile(tokens_path(Path(path))) as blobs:
        for number, raw in enumerate(fh, start=1):
            if not raw.endswith(b"\n"):
                return  # torn tail
            record = parse_record(raw)
            blob = b""
            if record is not None and is_packed(record):
                try:
                    if named is not None:
                        offset, length, _ = blob_ref(record)
                        named[0] = max(named[0], offset + length)
                    blob = blobs.blob(record)
                except BadTokens:
                    record = None
            if record is None:
                if bad_lines is not None and raw.strip():
                    bad_lines.append(number)
                continue
            yield record, blob


def with_token_lists(record: dict[str, Any], blob: bytes) -> dict[str, Any]:
    """A record as its line has it, with its token columns as lists (``blob``: the checked blob of a packed
    record; a record of the JSON-list kind is returned as it is)."""
    if not is_packed(record):
        return record
    out = {k: v for k, v in record.items() if k != TOKENS_KEY}
    out["trajectories"] = unpack_rows(record.get("trajectories") or [], blob)
    return out


def parse_record(raw: bytes) -> dict[str, Any] | None:
    """The record of one ledger line, or None when the line is not one (not JSON, not UTF-8, not a record)."""
    try:
        record = codec.loads(raw)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None
    return record if _is_record(record) else None


def _is_record(record: Any) -> bool:
    return (isinstance(record, dict) and isinstance(record.get("episode_id"), str)
            and isinstance(record.get("status"), str) and isinstance(record.get("samples", []), list)
            and all(isinstance(s, dict) for s in record.get("samples", [])))


#: Trajectories are the last key of a ledger record; everything before them is the small part of the line.
_TRAJECTORIES_KEY = b',"trajectories":['


def read_head(raw: bytes) -> dict[str, Any] | None:
    """A ledger line's record without its ``trajectories`` (cheap: they are not parsed, nor the blob of their
    token arrays read), or None when the line is not a record. The part of the line after the key is not
    checked here: a line whose head reads may still fail :func:`parse_record`."""
    cut = raw.find(_TRAJECTORIES_KEY)
    if cut > 0:
        try:
            head = codec.loads(raw[:cut] + b"}")
        except ValueError:
            pass  # the key sat inside a nested value (or the line is not JSON): parse the whole line
        else:
            if not _is_record(head):
                return None
            head.pop(TOKENS_KEY, None)
            return head
    record = parse_record(raw)
    if record is not None:
        record.pop("trajectories", None)
        record.pop(TOKENS_KEY, None)
    return record


def completed_ids(paths: list[Path], bad_lines: dict[Path, list[int]] | None = None,
                  named: dict[Path, int] | None = None) -> set[str]:
    """Ids of the episodes some ledger in ``paths`` records as completed (what ``latest_records`` keeps as
    ok), read a line at a time; ``bad_lines`` collects, per ledger, the numbers of lines that are not records,
    and ``named``, per ledger, the end of the furthest blob of its sidecar a line names."""
    done: set[str] = set()
    for path in paths:
        bad = None if bad_lines is None else bad_lines.setdefault(path, [])
        end = [0]
        for record in read_ledger(path, bad, tokens=False, named=end):
            if record["status"] == "ok":
                done.add(record["episode_id"])
        if named is not None:
            named[path] = end[0]
    return done


def latest_records(paths: list[Path], bad_lines: dict[Path, list[int]] | None = None) -> dict[str, dict[str, Any]]:
    """episode id -> its last ledger record across ``paths`` (a completed record beats a failed one);
    ``bad_lines`` collects, per ledger, the numbers of lines that are not records."""
    latest: dict[str, dict[str, Any]] = {}
    for path in paths:
        bad = None if bad_lines is None else bad_lines.setdefault(path, [])
        for record in read_ledger(path, bad):
            eid = record["episode_id"]
            old = latest.get(eid)
            if old is None or not (old["status"] == "ok" and record["status"] != "ok"):
                latest[eid] = record
    return latest
