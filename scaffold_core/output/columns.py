"""The columns of the trajectories dataset, and building them from records a chunk of rows at a time.

A column's *kind* is ``int64``, ``int32``, ``int8``, ``float32``, ``bool``,
``string`` or ``list:`` one of the numbers. Token columns packed in a blob
(:mod:`.tokens`) become Arrow arrays with a few numpy calls per chunk; other
values are taken as they are when each is of the column's exact Python type,
else through ``datasets``' encoding, so that every row gets exactly the
values ``Dataset.from_dict(columns, features=features)`` gives it. Arrays are
made from buffers (``Array.from_buffers``): ``pa.array`` and ``to_numpy``
import pandas (half a second) to check their arguments.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

from .tokens import CODES, TOKEN_COLUMNS, segment_values

#: The standard columns of the trajectories dataset and their kinds (``list:`` is a sequence of values).
STANDARD_KINDS = {
    "input_ids": "list:int64", "loss_mask": "list:int8", "logprobs": "list:float32", "versions": "list:int32",
    "reward": "float32", "advantage": "float32", "episode_id": "string", "sample_index": "int32",
    "group_id": "string", "prompt_len": "int32", "finish_reason": "string",
}
_NUMPY = {"int64": "<i8", "int8": "|i1", "float32": "<f4", "int32": "<i4"}


def datasets_feature(kind: str) -> Any:
    import datasets

    if kind.startswith("list:"):
        return datasets.Sequence(datasets.Value(kind[5:]))
    return datasets.Value(kind)


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
    """The Arrow schema of the dataset's shards, with the features ``datasets`` keeps in its metadata."""
    import pyarrow as pa

    features = {name: feature_dict(kind) for name, kind in kinds.items()}
    return pa.schema([(name, arrow_type(kind)) for name, kind in kinds.items()],
                     metadata={"huggingface": json.dumps({"info": {"features": features}})})


# -- the dataset ---------------------------------------------------------------------------------------
def build_batch(rows: list[tuple[Mapping[str, Any], bytes]], kinds: Mapping[str, str]) -> Any:
    """The rows as one Arrow RecordBatch with the columns ``kinds``: the values ``Dataset.from_dict`` gives."""
    import pyarrow as pa

    arrays = []
    for name, kind in kinds.items():
        column = None
        if name in TOKEN_COLUMNS and kind.startswith("list:"):
            column = _packed_column(rows, name, kind[5:])
        if column is None:
            values = ([_values(row, blob, name) for row, blob in rows] if name in TOKEN_COLUMNS
                      else [row.get(name) for row, _ in rows])
            column = _python_column(values, name, kind)
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, schema=dataset_schema(kinds))


def _values(row: Mapping[str, Any], blob: bytes, name: str) -> Any:
    value = row.get(name)
    if name in TOKEN_COLUMNS and isinstance(value, list) and value and isinstance(value[0], dict):
        return segment_values(value, blob)
    return value


# Columns are built with pyarrow's buffers (``Array.from_buffers``) and numpy only: ``pa.array`` and
# ``to_numpy`` import pandas (half a second) to check their arguments.
_STRUCT = {"int64": "q", "int32": "i", "int8": "b", "float32": "f"}


def _packed_column(rows: list[tuple[Mapping[str, Any], bytes]], name: str, kind: str) -> Any:
    """A list column from packed segments, with a few numpy calls per chunk (no Python value per token), or
    None when some row has it as a list or not at all."""
    import numpy as np
    import pyarrow as pa

    counts: list[int] = []
    fills: list[Any] = []
    sources: list[str | None] = []  # per segment: the dtype of an array, None for a fill
    arrays: dict[str, list[Any]] = {}
    offsets = [0]
    total = 0
    for row, blob in rows:
        segments = row.get(name)
        if not isinstance(segments, list) or (segments and not isinstance(segments[0], dict)):
            return None
        for seg in segments:
            n = seg["n"]
            if "fill" in seg:
                fills.append(seg["fill"])
                sources.append(None)
            else:
                dtype, at = seg["dtype"], seg["at"]
                arrays.setdefault(dtype, []).append(memoryview(blob)[at:at + n * CODES[dtype][1]])
                fills.append(0)
                sources.append(dtype)
            counts.append(n)
            total += n
        offsets.append(total)
    target = _NUMPY[kind]
    buffer = pa.allocate_buffer(total * np.dtype(target).itemsize)
    out = np.frombuffer(buffer, dtype=target)  # written in place: Arrow's memory (see _aligned)
    if len(arrays) == 1 and None not in sources:  # arrays of one dtype only (input_ids): cast straight into place
        dtype, pieces = next(iter(arrays.items()))
        data = np.frombuffer(b"".join(pieces), dtype=dtype)
        out[:] = data if np.can_cast(data.dtype, out.dtype) else _converted(data, target)
    else:  # the fills, then the arrays put in their places
        out[:] = np.repeat(_numbers(fills, target), counts)
        for dtype, pieces in arrays.items():
            where = np.repeat(np.fromiter((s == dtype for s in sources), bool, len(sources)), counts)
            out[where] = _converted(np.frombuffer(b"".join(pieces), dtype=dtype), target)
    value_type = arrow_type(kind)
    values = pa.Array.from_buffers(value_type, total, [None, buffer])
    return pa.Array.from_buffers(pa.list_(value_type), len(rows), [None, _aligned(struct.pack(
        f"<{len(offsets)}i", *offsets))], children=[values])


def _aligned(data: bytes) -> Any:
    """``data`` in a buffer of Arrow's own (64-byte aligned) memory. Arrow's IPC writer writes a buffer that
    is not so aligned (numpy's and Python's memory, 16-byte aligned) many times slower: 47 ms against 3 ms
    for a 16 MB batch, measured."""
    import numpy as np
    import pyarrow as pa

    buffer = pa.allocate_buffer(len(data))
    np.frombuffer(buffer, dtype=np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
    return buffer


def _numbers(values: list[Any], target: str) -> Any:
    """Python numbers as a numpy array of ``target``; an integer it cannot hold raises OverflowError."""
    import numpy as np

    out = np.array(values, dtype=target)
    if out.dtype.kind in "iu" and len(values) and out.tolist() != values:
        raise OverflowError(f"a value does not fit {target}")
    return out


def _converted(data: Any, target: str) -> Any:
    """A numpy array of array segments' values as one of ``target`` (a value ``target`` cannot hold raises
    OverflowError, as pyarrow raises converting such a value)."""
    import numpy as np

    if data.dtype == np.dtype(target):
        return data
    out = data.astype(target)
    if out.dtype.kind in "iu" and not np.can_cast(data.dtype, out.dtype) and (out != data).any():
        raise OverflowError(f"a value does not fit {target}")
    return out


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
    to ``pa.array`` (a number out of range, a string that is not UTF-8)."""
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


