"""Reading the text files a user hands scaffold (configs, datasets, ``scaffold score --input``).

Bytes that are not UTF-8 become one error naming the file, the line, the column and the fix, never a
``UnicodeDecodeError`` traceback. The caller chooses the error class (``ConfigError`` for a config,
``DataError`` for data).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from .errors import DataError, ScaffoldError


def not_utf8_message(path: str | Path, line: int, column: int, byte: int) -> str:
    """``FILE:LINE: not UTF-8 (byte 0xff at column 7); save the file as UTF-8, e.g. ...``."""
    return (f"{path}:{line}: not UTF-8 (byte 0x{byte:02x} at column {column}); save the file as UTF-8, "
            f"e.g. iconv -f latin1 -t utf-8 {path} -o {Path(path).stem}.utf8{Path(path).suffix}")


def decode_line(raw: bytes, path: str | Path, number: int, *,
                error: type[ScaffoldError] = DataError) -> str:
    """One line of ``path`` (1-based ``number``) as text; ``error`` naming the line and column if it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        column = len(raw[: exc.start].decode("utf-8", errors="replace")) + 1
        raise error(not_utf8_message(path, number, column, raw[exc.start])) from None


def decode_text(data: bytes, path: str | Path, *, error: type[ScaffoldError] = DataError) -> str:
    """A whole file's bytes as text; ``error`` naming the first bad line and column if it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        line_end = data.find(b"\n", exc.start)
        number = data.count(b"\n", 0, exc.start) + 1
        decode_line(data[line_start: None if line_end < 0 else line_end], path, number, error=error)
        raise AssertionError("unreachable") from None  # pragma: no cover - decode_line raised


def utf8_lines(path: str | Path, *, error: type[ScaffoldError] = DataError) -> Iterator[tuple[int, str]]:
    """(line number, text without the newline) of every line of ``path``, read as a stream."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            yield number, decode_line(raw, path, number, error=error).rstrip("\r\n")


def check_utf8(path: str | Path, *, error: type[ScaffoldError] = DataError) -> None:
    """Raise ``error`` (file, line, column, fix) unless every byte of ``path`` is UTF-8."""
    for _ in utf8_lines(path, error=error):
        pass
