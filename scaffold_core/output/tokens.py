"""The run store's encoding of a training sequence's token columns: exact values in a few bytes per token.

Each of ``input_ids``, ``loss_mask``, ``logprobs``, ``versions`` and (when a teacher
scored the sequence, see :mod:`scaffold_core.teacher`) ``teacher_logprobs`` is cut at
the sequence's ``prompt_len`` into its prompt part and the rest, and each part
is one *segment*, described in the sequence's JSON (see
:mod:`scaffold_core.output.store`):

* ``["run", value, n]``: ``n`` copies of ``value`` (a prompt's loss mask 0,
  version -1, logprob 0.0; a generated part's one weight version);
* ``[dtype, at, n]``: ``n`` values of that numpy dtype (``|u1``, ``<u2``,
  ``<i4``, ``<i8``, ``|i1``, ``<f4``, ``<f8``) at byte ``at`` of the episode's
  ``tokens`` blob; integers in the narrowest that holds them, logprobs (behaviour and teacher) as
  ``<f4`` when float32 holds every one bit for bit, else ``<f8``;
* ``["json", values]``: values that are not numbers a dtype holds exactly
  (integers beyond 64 bits, ``None``), kept as they are.

:func:`column_values` gives a column back as the list the trajectory maker
made (floats as floats, bit for bit: a zero keeps its sign); the exports read
the segments with numpy (:mod:`scaffold_core.output.export`).
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from typing import Any

#: The training sequence's columns encoded here.
TOKEN_COLUMNS = ("input_ids", "loss_mask", "logprobs", "versions", "teacher_logprobs")
#: Columns a sequence may leave out by holding None (kept as null in its JSON).
OPTIONAL_COLUMNS = frozenset({"teacher_logprobs"})
#: Columns of floats.
FLOAT_COLUMNS = frozenset({"logprobs", "teacher_logprobs"})
#: struct (and array) type code -> numpy dtype, per column, narrowest first.
_INTS = {"input_ids": (("B", "|u1"), ("H", "<u2"), ("i", "<i4"), ("q", "<i8")),
         "loss_mask": (("b", "|i1"), ("i", "<i4"), ("q", "<i8")),
         "versions": (("i", "<i4"), ("q", "<i8"))}
#: numpy dtype -> array type code.
CODES = {"|u1": "B", "<u2": "H", "<i4": "i", "<i8": "q", "|i1": "b", "<f4": "f", "<f8": "d"}
_LITTLE = sys.byteorder == "little"


def encode_columns(row: Any, blob: bytearray) -> dict[str, list[list[Any]]]:
    """The segments of each token column ``row`` (a mapping) has, appending their arrays to ``blob``.
    TypeError when a column is not a list."""
    p = row.get("prompt_len")
    p = p if type(p) is int else 0
    out: dict[str, list[list[Any]]] = {}
    for name in TOKEN_COLUMNS:
        values = row.get(name)
        if values is None and (name not in row or name in OPTIONAL_COLUMNS):
            continue
        if not isinstance(values, (list, tuple)):
            raise TypeError(f"training sequence field {name} is a {type(values).__name__}, not a list")
        if type(values) is not list:
            values = list(values)
        n = len(values)
        if not n:
            out[name] = []
        elif name == "input_ids":
            out[name] = [_ints(values, name, blob)]
        elif name in FLOAT_COLUMNS:
            out[name] = _floats(values, p, n, blob)
        else:
            out[name] = _int_runs(values, p, n) or [_ints(part, name, blob) for part in _parts(values, p, n)]
    return out


def _parts(values: list[Any], p: int, n: int) -> list[list[Any]]:
    return [values[:p], values[p:]] if 0 < p < n else [values]


def _ints(part: list[Any], name: str, blob: bytearray) -> list[Any]:
    """One segment of integers: a run when one value repeats (not for ids), else an array of the narrowest
    dtype that holds them, else (not integers of 64 bits) JSON."""
    n = len(part)
    first = part[0]
    if name != "input_ids" and type(first) is int and part.count(first) == n:
        return ["run", first, n]
    if name == "input_ids":
        try:
            ids = bytearray(part)  # three times as fast as struct when every id fits a byte
        except ValueError:  # an id beyond a byte
            pass
        except TypeError:
            return ["json", part]
        else:
            at = len(blob)
            blob += ids
            return ["|u1", at, n]
    for code, dtype in _INTS[name]:
        try:
            data = struct.pack(f"<{n}{code}", *part)  # faster than array(code, part), and little-endian
        except struct.error as exc:
            if "format requires" in str(exc) or "out of range" in str(exc):
                continue  # a value beyond this dtype: the next one
            break  # not an integer
        except (TypeError, OverflowError):
            break
        at = len(blob)
        blob += data
        return [dtype, at, n]
    return ["json", part]


def _int_runs(values: list[Any], p: int, n: int) -> list[list[Any]] | None:
    """The common layout of a loss mask or versions (the prompt's part one integer repeated, the rest
    another) as two runs, found with one comparison in C; None for any other layout."""
    first = values[0]
    if type(first) is not int:
        return None
    if not 0 < p < n:
        return [["run", first, n]] if values == _layout(first, first, n, n) else None
    then = values[p]
    if type(then) is int and values == _layout(first, then, p, n):
        return [["run", first, p], ["run", then, n - p]]
    return None


def _floats(values: list[Any], p: int, n: int, blob: bytearray) -> list[list[Any]]:
    """Logprobs: each part a run when its values are one value repeated bit for bit (a zero keeps its sign),
    else an array (<f4 when float32 holds every value exactly)."""
    try:
        raw = struct.pack(f"<{n}d", *values)  # twice as fast as array("d", values)
    except (struct.error, TypeError):
        return [["json", values]]
    out = []
    for start, end in ((0, p), (p, n)) if 0 < p < n else ((0, n),):
        k = end - start
        part = raw[8 * start:8 * end]
        if part == _repeated(part[:8], k):
            value = struct.unpack_from("<d", part)[0]
            if math.isfinite(value):
                out.append(["run", value, k])
                continue
        import numpy as np

        data = np.frombuffer(part, dtype="<f8")
        narrow = data.astype("<f4")
        at = len(blob)
        if (narrow == data).all():  # NaN never compares equal: kept as <f8, exactly
            blob += narrow.tobytes()
            out.append(["<f4", at, k])
        else:
            blob += part
            out.append(["<f8", at, k])
    return out


#: Recent layouts (``[a] * p + [b] * (n - p)`` lists, and repeated bytes): samples of one prompt, and runs of
#: one task, share them.
_LAYOUTS: dict[tuple[Any, ...], Any] = {}


def _layout(first: int, then: int, p: int, n: int) -> list[int]:
    key = (first, then, p, n)
    layout = _LAYOUTS.get(key)
    if layout is None:
        if len(_LAYOUTS) >= 64:
            _LAYOUTS.clear()
        layout = _LAYOUTS[key] = [first] * p + [then] * (n - p)
    return layout


def _repeated(unit: bytes, count: int) -> bytes:
    key = (unit, count)
    data = _LAYOUTS.get(key)
    if data is None:
        if len(_LAYOUTS) >= 64:
            _LAYOUTS.clear()
        data = _LAYOUTS[key] = unit * count
    return data


def column_values(segments: list[list[Any]], blob: bytes) -> list[Any]:
    """A column's values as a list (the values the trajectory maker gave, ints as ints, floats as floats)."""
    out: list[Any] = []
    for seg in segments:
        kind = seg[0]
        if kind == "run":
            out += [seg[1]] * seg[2]
        elif kind == "json":
            out += seg[1]
        else:
            values = array(CODES[kind])
            values.frombytes(blob[seg[1]:seg[1] + seg[2] * values.itemsize])
            if not _LITTLE and values.itemsize > 1:
                values.byteswap()
            out += values.tolist()
    return out


def token_count(segments: list[list[Any]]) -> int:
    """The number of values of an encoded column."""
    return sum(seg[2] if seg[0] != "json" else len(seg[1]) for seg in segments)
