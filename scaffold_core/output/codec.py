"""Fast JSON for run files: orjson where it gives the same content as the standard library, else the library.

orjson encodes and decodes about five to ten times faster than ``json``, but
not always to the same content: it writes NaN and infinities as ``null``
(``json`` writes ``NaN``/``Infinity``) and serialises dataclasses, datetimes
and subclasses of built-in types that ``json`` rejects or writes otherwise.
:func:`dumps_compact` therefore uses orjson only for values made of plain
dicts, lists, strings, numbers, booleans and None with every float finite,
and falls back to ``json.dumps(..., ensure_ascii=False, separators=(",", ":"))``
for anything else, so a line always parses back to what ``json`` would have
written. :func:`loads` reads with orjson and falls back to ``json`` for what
orjson refuses (``NaN``, ``Infinity``, lone surrogates).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import orjson

#: Hand everything but plain JSON values to ``default`` (absent here), so that orjson raises TypeError on them.
STRICT = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS


def all_finite(value: Any) -> bool:
    """True when no float in ``value`` (nested dicts, lists and tuples) is NaN or infinite."""
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is float:
            if item - item != 0.0:  # NaN and ±inf give NaN
                return False
        elif kind is dict:
            extend(item.values())
        elif kind is list or kind is tuple:
            extend(item)
    return True  # str, int, bool, None; anything else is refused by the STRICT encoder


#: Types of values with no float inside.
LEAVES = frozenset((str, int, bool, type(None)))


def values_finite(values: Iterable[Any]) -> bool:
    """:func:`all_finite` of each of ``values``, quicker when most are strings, integers and None (a record's
    fields): their types are tested here, and only containers are walked."""
    leaves = LEAVES
    for value in values:
        kind = type(value)
        if kind in leaves:
            continue
        if kind is float:
            if value - value != 0.0:
                return False
        elif not all_finite(value):
            return False
    return True


#: Characters JSON may leave raw in a string but that Python's ``str.splitlines`` (and other line-based
#: readers) take as line breaks: NEL, LINE SEPARATOR, PARAGRAPH SEPARATOR, as UTF-8 -> their JSON escapes.
_LINE_BREAKS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def one_line(data: bytes) -> bytes:
    """JSON ``data`` with every Unicode line break escaped, so a JSONL line is one line to any reader.

    UTF-8 never has these byte sequences inside another character, and outside strings JSON has no such
    characters, so the replacement keeps the content exactly.
    """
    if data.isascii():  # one fast scan; the common case (ids, numbers, English text) stops here
        return data
    for raw, escaped in _LINE_BREAKS:
        if raw in data:
            data = data.replace(raw, escaped)
    return data


def _orjson(value: Any) -> bytes | None:
    try:
        data = orjson.dumps(value, option=STRICT)
    except TypeError:  # orjson.JSONEncodeError: a type json writes otherwise, or an int beyond 64 bits
        return None
    # A null may be a NaN or infinity orjson wrote as null. Reading the bytes back gives the value itself
    # when it holds none (a check in C); when it does not (a NaN, or tuples and fragments, which read back as
    # lists), the value is walked.
    if b"null" in data and orjson.loads(data) != value and not all_finite(value):
        return None
    return data


def dumps_finite(value: Any) -> bytes | None:
    """:func:`dumps_fast` for a value the caller knows holds no NaN or infinity (so a null orjson writes is a
    None): no check of the value after encoding."""
    try:
        data = orjson.dumps(value, option=STRICT)
    except TypeError:
        return None
    return one_line(data)


def dumps_fast(value: Any) -> bytes | None:
    """``value`` as compact JSON bytes with orjson, or None when only ``json`` writes it faithfully."""
    data = _orjson(value)
    return None if data is None else one_line(data)


def dumps_compact(value: Any) -> bytes:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"))`` in content, UTF-8 encoded, fast."""
    data = dumps_fast(value)
    if data is not None:
        return data
    return one_line(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


#: Digits as zeros: twenty zeros in a row in a text so translated are twenty digits in a row in the text,
#: maybe an integer beyond 64 bits, which orjson reads as a float.
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_TWENTY = b"0" * 20


def loads(raw: bytes | str) -> Any:
    """Parse one JSON document as ``json.loads`` does (orjson first; ``json`` for NaN, Infinity and the like,
    and for integers beyond 64 bits).

    Raises ``json.JSONDecodeError`` when neither accepts it.
    """
    if _TWENTY not in (raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")).translate(_DIGITS):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)
