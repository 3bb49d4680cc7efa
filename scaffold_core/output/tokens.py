"""Token arrays packed in binary: how the ledger keeps each training sequence's ``input_ids``, ``loss_mask``,
``logprobs`` and ``versions``.

An episode's arrays are one *blob* appended to the ledger's sidecar file
(``episodes.tokens.bin`` next to ``episodes.jsonl``; ``episodes.rank-NNNNN.tokens.bin``
next to a worker's ledger) just before its ledger line; the line names the
blob, ``"tokens": [offset, length, crc32]``, and each training sequence in its
``trajectories`` gives, per column, the segments its values are made of:

* ``{"fill": v, "n": k}``: ``k`` copies of ``v`` (a prompt's loss mask 0, version -1, logprob 0.0);
* ``{"dtype": "<u2", "at": b, "n": k}``: ``k`` values of that numpy dtype at byte ``b`` of the blob.

The values are the given ones exactly: integers in the narrowest of
``|u1 <u2 <i4 <i8`` (ids; ``|i1 <i4 <i8`` for masks and versions) that
holds them, logprobs as ``<f4`` when float32 holds every one exactly, else
``<f8``. A sequence whose values do not pack (not numbers, beyond 64 bits)
is written the way ledgers were before, as JSON lists in the line.

Read them with :func:`scaffold_core.output.read_ledger` (lists, as the
trajectory maker made them), or with numpy from the segments:
``numpy.frombuffer(blob, dtype=seg["dtype"], count=seg["n"], offset=seg["at"])``.
A blob that is missing, short or whose CRC-32 differs makes its line "not a
record": its episode runs again on ``--resume``.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .files import open_nofollow

#: The training sequence's columns kept in the blob.
TOKEN_COLUMNS = ("input_ids", "loss_mask", "logprobs", "versions")
#: The key of a ledger line that names its blob.
TOKENS_KEY = "tokens"
#: Sidecar of ``episodes.jsonl``: ``episodes.tokens.bin``.
TOKENS_SUFFIX = ".tokens.bin"

#: (struct code, numpy dtype) to try in order, narrowest first, per column.
_INT_IDS = (("B", "|u1"), ("H", "<u2"), ("i", "<i4"), ("q", "<i8"))
_INT_SMALL = (("b", "|i1"), ("i", "<i4"), ("q", "<i8"))
_INT_WIDE = (("i", "<i4"), ("q", "<i8"))
_FORMATS = {"input_ids": _INT_IDS, "loss_mask": _INT_SMALL, "versions": _INT_WIDE}
#: numpy dtype -> (struct code, item size).
CODES = {"|u1": ("B", 1), "<u2": ("H", 2), "<i4": ("i", 4), "<i8": ("q", 8), "|i1": ("b", 1), "<f4": ("f", 4),
         "<f8": ("d", 8)}


class PackError(ValueError):
    """Values that do not pack exactly (not numbers, or integers beyond 64 bits)."""


class BadTokens(ValueError):
    """A ledger line's blob is missing, short or damaged."""


def tokens_name(ledger_name: str) -> str:
    """The sidecar of a ledger: ``episodes.jsonl`` -> ``episodes.tokens.bin``."""
    stem = ledger_name[:-len(".jsonl")] if ledger_name.endswith(".jsonl") else ledger_name
    return stem + TOKENS_SUFFIX


def tokens_path(ledger: Path) -> Path:
    return ledger.with_name(tokens_name(ledger.name))


# -- packing -----------------------------------------------------------------------------------------
def _pack_ints(values: Sequence[Any], formats: tuple[tuple[str, str], ...]) -> tuple[bytes, str, str]:
    n = len(values)
    for code, dtype in formats:
        try:
            return struct.pack(f"<{n}{code}", *values), code, dtype
        except struct.error as exc:
            if "format requires" not in str(exc) and "out of range" not in str(exc):
                raise PackError(str(exc)) from None
        except (TypeError, OverflowError) as exc:
            raise PackError(str(exc)) from None
    raise PackError("an integer beyond 64 bits")


def _pack_floats(values: Sequence[Any]) -> tuple[bytes, str, str]:
    try:
        return struct.pack(f"<{len(values)}d", *values), "d", "<f8"
    except (struct.error, TypeError, OverflowError) as exc:
        raise PackError(str(exc)) from None


def _narrow_floats(raw: bytes) -> tuple[bytes, str]:
    """``raw`` (<f8) as <f4 when float32 holds every value bit for bit, else as it is."""
    import numpy as np

    wide = np.frombuffer(raw, dtype="<f8")
    narrow = wide.astype("<f4")
    if narrow.astype("<f8").tobytes() == raw:
        return narrow.tobytes(), "<f4"
    return raw, "<f8"


def _column(values: Sequence[Any], name: str, prompt_len: int, pieces: list[bytes], at: int
            ) -> tuple[list[dict[str, Any]], int]:
    """Segments of one column (appending array bytes to ``pieces`` from blob offset ``at``); the next offset.

    The prompt's part and the rest (split at ``prompt_len``) are each a fill when one value repeats;
    ``input_ids`` is always an array."""
    n = len(values)
    if n == 0:
        return [], at
    if type(values) is not list:
        values = list(values)
    if name == "input_ids":
        raw, dtype = _pack_ids(values)
        pieces.append(raw)
        return [{"dtype": dtype, "at": at, "n": n}], at + len(raw)
    if name == "logprobs":
        return _float_column(values, prompt_len, pieces, at)
    cuts = [(0, prompt_len), (prompt_len, n)] if 0 < prompt_len < n else [(0, n)]
    if _int_runs(values, n, prompt_len):
        return [{"fill": values[start], "n": end - start} for start, end in cuts], at
    segments: list[dict[str, Any]] = []
    for start, end in cuts:
        part = values if end - start == n else values[start:end]
        first = part[0]
        if type(first) is int and part.count(first) == len(part):
            segments.append({"fill": first, "n": end - start})
            continue
        raw, _, dtype = _pack_ints(part, _FORMATS[name])
        segments.append({"dtype": dtype, "at": at, "n": end - start})
        pieces.append(raw)
        at += len(raw)
    return segments, at


def _pack_ids(values: list[Any]) -> tuple[bytes, str]:
    try:
        return bytearray(values), "|u1"  # type: ignore[return-value]  # bytearray(list) is twice as fast as bytes
    except ValueError:  # a value beyond a byte
        raw, _, dtype = _pack_ints(values, _INT_IDS[1:])
        return raw, dtype
    except TypeError as exc:
        raise PackError(str(exc)) from None


def _int_runs(values: list[Any], n: int, prompt_len: int) -> bool:
    """Whether the prompt's part and the rest are each one integer repeated (the common layout: a loss
    mask of 0s then 1s, versions of -1s then one version): one comparison with that layout."""
    first = values[0]
    if type(first) is not int:
        return False
    if not 0 < prompt_len < n:
        return values == _layout(first, first, n, n)
    then = values[prompt_len]
    return type(then) is int and values == _layout(first, then, prompt_len, n)


#: Recent layouts (``[a] * p + [b] * (n - p)`` lists, repeated values as bytes): samples of one prompt, and
#: runs of one task, share them.
_LAYOUTS: dict[tuple[Any, ...], Any] = {}


def _layout(first: Any, then: Any, prompt_len: int, n: int) -> Any:
    key = (first, then, prompt_len, n)
    layout = _LAYOUTS.get(key)
    if layout is None:
        if len(_LAYOUTS) >= 64:
            _LAYOUTS.clear()
        layout = _LAYOUTS[key] = [first] * prompt_len + [then] * (n - prompt_len)
    return layout


def _repeated(unit: bytes, count: int) -> bytes:
    key = (unit, count)
    data = _LAYOUTS.get(key)
    if data is None:
        if len(_LAYOUTS) >= 64:
            _LAYOUTS.clear()
        data = _LAYOUTS[key] = unit * count
    return data


def _float_column(values: list[Any], prompt_len: int, pieces: list[bytes], at: int
                  ) -> tuple[list[dict[str, Any]], int]:
    """Logprobs: packed as <f8 once; a part whose bytes are one value repeated (bit for bit: a zero keeps its
    sign) is a fill, any other part is packed (as <f4 when float32 holds it exactly)."""
    n = len(values)
    raw = _pack_floats(values)[0]
    cuts = [(0, prompt_len), (prompt_len, n)] if 0 < prompt_len < n else [(0, n)]
    segments: list[dict[str, Any]] = []
    for start, end in cuts:
        part = raw if end - start == n else raw[8 * start:8 * end]
        unit = part[:8]
        if part == _repeated(unit, end - start):
            first = values[start]
            segments.append({"fill": first if type(first) is float else struct.unpack("<d", unit)[0],
                             "n": end - start})
            continue
        data, dtype = _narrow_floats(part)
        segments.append({"dtype": dtype, "at": at, "n": end - start})
        pieces.append(data)
        at += len(data)
    return segments, at


def pack_row(columns: Mapping[str, Sequence[Any]], prompt_len: Any, pieces: list[bytes], at: int
             ) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """Segments of the token columns a training sequence has (of :data:`TOKEN_COLUMNS`), appending their
    bytes to ``pieces`` from blob offset ``at``; the next offset. Raises PackError for values that do not pack."""
    p = prompt_len if type(prompt_len) is int else 0
    specs = {}
    for name in TOKEN_COLUMNS:
        if name not in columns:
            continue
        values = columns[name]
        if not isinstance(values, (list, tuple)):
            raise PackError(f"{name} is a {type(values).__name__}, not a list")
        specs[name], at = _column(values, name, p, pieces, at)
    return specs, at


# -- reading -----------------------------------------------------------------------------------------
def is_packed(record: Mapping[str, Any]) -> bool:
    """Whether a ledger record's token columns are in a blob (else they are JSON lists in the line)."""
    return TOKENS_KEY in record


def blob_ref(record: Mapping[str, Any]) -> tuple[int, int, int]:
    """(offset, length, crc32) of a packed record's blob; BadTokens when the reference is malformed."""
    ref = record.get(TOKENS_KEY)
    if (not isinstance(ref, list) or len(ref) != 3 or not all(type(v) is int and v >= 0 for v in ref)):
        raise BadTokens(f"malformed {TOKENS_KEY!r} reference {ref!r}")
    return ref[0], ref[1], ref[2]


def check_rows(rows: Any, size: int) -> None:
    """BadTokens unless every segment of every packed column of ``rows`` is well formed and lies in a blob
    of ``size`` bytes."""
    if not isinstance(rows, list):
        raise BadTokens("trajectories must be a list")
    for row in rows:
        if not isinstance(row, dict):
            raise BadTokens(f"a trajectory must be an object, got {type(row).__name__}")
        for name in TOKEN_COLUMNS:
            segments = row.get(name)
            if segments is None:
                continue
            if not isinstance(segments, list):
                raise BadTokens(f"{name}: segments must be a list, got {type(segments).__name__}")
            for seg in segments:
                _check(seg, size)


def _check(seg: Any, size: int) -> None:
    if not isinstance(seg, dict) or type(seg.get("n")) is not int or seg["n"] < 0:
        raise BadTokens(f"malformed segment {seg!r}")
    if "fill" in seg:
        if type(seg["fill"]) not in (int, float):
            raise BadTokens(f"malformed segment {seg!r}")
        return
    code = CODES.get(seg.get("dtype"))  # type: ignore[arg-type]
    at = seg.get("at")
    if code is None or type(at) is not int or at < 0 or at + seg["n"] * code[1] > size:
        raise BadTokens(f"segment {seg!r} is malformed or lies outside its blob of {size} bytes")


def segment_values(segments: Any, blob: bytes) -> list[Any]:
    """The values of one column from its segments (BadTokens when they do not fit the blob)."""
    out: list[Any] = []
    if not isinstance(segments, list):
        raise BadTokens(f"segments must be a list, got {type(segments).__name__}")
    for seg in segments:
        try:
            n = seg["n"]
            if "fill" in seg:
                out += [seg["fill"]] * n
                continue
            code, width = CODES[seg["dtype"]]
            at = seg["at"]
            if at < 0 or n < 0 or at + n * width > len(blob):
                raise BadTokens(f"segment {seg!r} lies outside its blob of {len(blob)} bytes")
            out += struct.unpack_from(f"<{n}{code}", blob, at)
        except (KeyError, TypeError, struct.error) as exc:
            raise BadTokens(f"malformed segment {seg!r} ({exc})") from None
    return out


def unpack_rows(rows: list[Any], blob: bytes) -> list[dict[str, Any]]:
    """The training sequences of a packed record with their token columns as lists."""
    out = []
    for row in rows:
        if not isinstance(row, dict):
            raise BadTokens(f"a trajectory must be an object, got {type(row).__name__}")
        full = dict(row)
        for name in TOKEN_COLUMNS:
            if name in full:
                full[name] = segment_values(full[name], blob)
        out.append(full)
    return out


class TokenFile:
    """Reads blobs from one sidecar by position (``os.pread``; never through a link). A missing sidecar
    reads as empty: every blob it should hold is missing."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None
        self._size = -1

    def _open(self) -> int | None:
        if self._fd is None and self._size < 0:
            if os.path.lexists(self.path):
                self._fd = open_nofollow(self.path, os.O_RDONLY)
            self._size = 0
        return self._fd

    def blob(self, record: Mapping[str, Any]) -> bytes:
        """The checked blob of a packed record; BadTokens when it is missing, short or damaged, or when a
        segment of the record's rows is malformed or lies outside it (:func:`check_rows`)."""
        offset, length, crc = blob_ref(record)
        fd = self._open()
        raw = os.pread(fd, length, offset) if fd is not None and length else b""
        if len(raw) != length:
            raise BadTokens(f"{self.path} ends before the {length} bytes at {offset}")
        if zlib.crc32(raw) != crc:
            raise BadTokens(f"the {length} bytes at {offset} of {self.path} are damaged (CRC-32 differs)")
        check_rows(record.get("trajectories"), len(raw))
        return raw

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._size = -1

    def __enter__(self) -> TokenFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
