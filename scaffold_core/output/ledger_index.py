"""Where each episode's latest ledger record sits: the ledgers read in bounded memory.

:func:`~scaffold_core.output.ledger.latest_records` holds every record of a
run in memory (about 55 KB per 1,000-token episode). A :class:`LedgerIndex`
holds six integers per ledger line instead (an id hash, the row index, the
status, the file, the offset and the length) and reads records back from
the files when they are needed, so the end of a run of a million episodes
needs tens of megabytes, not tens of gigabytes. It keeps the same rules:

* the record that counts for an episode is its last completed one, else its
  last one (a completed record beats a failed one; the latest wins);
* a torn last line ends a file; a line that is not a record (not JSON, not UTF-8) is ignored;
* records come out ordered by ``(index, episode_id)`` (:meth:`records`), or
  in the order their episodes first appear in the ledgers, the order of
  ``latest_records(...).values()`` (:meth:`heads_in_ledger_order`).

Building the index parses only the small part of each line before its
``trajectories``. Records are read back whole with their token arrays, from
the ledgers' sidecars (:mod:`.tokens`): as lists (:meth:`LedgerIndex.records`)
or packed, with their blobs (:meth:`LedgerIndex.packed_records`). A ledger
this index cannot describe exactly (an index that is not an integer) leaves
``index.exact`` False, and a line whose record turns out not to be one when
it is read in full (or whose blob is missing or damaged) raises
:class:`LedgerChanged`; callers then fall back to ``latest_records``.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .files import open_nofollow
from .ledger import parse_record, read_head, with_token_lists
from .tokens import BadTokens, TokenFile, is_packed, tokens_path


class LedgerChanged(Exception):
    """A ledger line no longer reads as it did when the index was built (or only its head was a record)."""


class LedgerIndex:
    """The latest record of every episode in ``paths``, located, not loaded.

    ``on_head`` sees every line's record without its trajectories as the ledgers are read; when no episode
    has several lines (``duplicates`` False) that is every episode's record, in ledger order.
    """

    def __init__(self, paths: list[Path], on_head: Callable[[dict[str, Any]], None] | None = None, *,
                 scan: bool = True):
        """``scan=False``: the ledgers are not read here; the lines are given with :meth:`note` as they are
        appended (the run that writes them keeps its index), then :meth:`complete` is called."""
        self.paths = [Path(p) for p in paths]
        self._on_head = on_head
        self.exact = True
        self.duplicates = False
        self._hash = array("q")
        self._index = array("q")
        self._ok = array("b")
        self._file = array("q")
        self._offset = array("q")
        self._length = array("q")
        self._fds: dict[int, int] = {}
        self._blobs: dict[int, TokenFile] = {}
        self._winners: Any = None  # line numbers of every episode's record, in (index, episode_id) order
        self._first: Any = None  # the same lines, in the order their episodes first appear
        if scan:
            for number, path in enumerate(self.paths):
                if not self._scan(number, path):  # (note() has set exact False)
                    break
            self.complete()

    def __len__(self) -> int:
        return 0 if self._winners is None else len(self._winners)

    # -- building ----------------------------------------------------------------
    def _scan(self, number: int, path: Path) -> bool:
        """Index one ledger; False when a line cannot be described by the index."""
        if not os.path.lexists(path):
            return True
        offset = 0
        with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as fh:  # a link is refused, never followed
            for raw in fh:
                size = len(raw)
                if not raw.endswith(b"\n"):
                    break  # torn tail
                head = read_head(raw)
                if head is not None and not self.note(number, offset, size, head):  # (else not a record: ignored)
                    return False
                offset += size
        return True

    def note(self, number: int, offset: int, size: int, head: dict[str, Any]) -> bool:
        """Index the record ``head`` (its trajectories are not looked at), the line of ``size`` bytes at
        ``offset`` of ledger ``number``; False (and nothing indexed) when the index cannot describe it."""
        index = head.get("index", 0)
        if type(index) is not int:
            self.exact = False
            return False
        self._hash.append(hash(head["episode_id"]))
        self._index.append(index)
        self._ok.append(head["status"] == "ok")
        self._file.append(number)
        self._offset.append(offset)
        self._length.append(size)
        if self._on_head is not None:
            self._on_head(head)
        return True

    def complete(self) -> None:
        """Order the lines indexed (done by the constructor unless ``scan=False``)."""
        if self.exact:
            self._choose()

    def _choose(self) -> None:
        """Pick each episode's record and put them in output order (numpy: no Python work per line
        except for episodes with several lines, or ids whose hashes collide)."""
        import numpy as np

        hashes = np.frombuffer(self._hash, dtype=np.int64) if self._hash else np.zeros(0, np.int64)
        n = len(hashes)
        by_hash = np.argsort(hashes, kind="stable")  # lines of one hash stay in ledger order
        sorted_hashes = hashes[by_hash]
        starts = np.flatnonzero(np.r_[True, sorted_hashes[1:] != sorted_hashes[:-1]]) if n else np.zeros(0, np.int64)
        sizes = np.diff(np.r_[starts, n])
        winners = [by_hash[starts[sizes == 1]]]
        firsts = [winners[0]]
        if (sizes > 1).any():
            self.duplicates = True
            more_w, more_f = self._resolve([by_hash[s:s + k] for s, k in zip(starts[sizes > 1], sizes[sizes > 1])])
            winners.append(np.asarray(more_w, dtype=np.int64))
            firsts.append(np.asarray(more_f, dtype=np.int64))
        win = np.concatenate(winners).astype(np.int64)
        first = np.concatenate(firsts).astype(np.int64)
        self._first = win[np.argsort(first, kind="stable")]
        index = np.frombuffer(self._index, dtype=np.int64)[win] if n else np.zeros(0, np.int64)
        order = np.lexsort((hashes[win], index))  # by index, then by id hash; ties of index are sorted by id below
        win = win[order]
        index = index[order]
        if len(win) > 1 and (index[1:] == index[:-1]).any():
            win = self._sort_ties(win, index)
        self._winners = win

    def _resolve(self, groups: list[Any]) -> tuple[list[int], list[int]]:
        """(winning line, first line) per episode among lines that share an id hash: several records of one
        episode (a retried failure, a resumed run) or, rarely, different episodes with the same hash."""
        winners: list[int] = []
        firsts: list[int] = []
        for lines in groups:
            episodes: dict[str, list[int]] = {}
            for line in lines.tolist():
                try:
                    record, _ = self._read_packed(line)
                except LedgerChanged:
                    continue  # not a record: ignored, as latest_records ignores it
                episodes.setdefault(record["episode_id"], []).append(line)
            for seen in episodes.values():
                ok = [line for line in seen if self._ok[line]]
                winners.append(ok[-1] if ok else seen[-1])
                firsts.append(seen[0])
        return winners, firsts

    def _sort_ties(self, win: Any, index: Any) -> Any:
        """Order episodes that share an index by their id (as ``sorted`` by ``(index, episode_id)`` does)."""
        import numpy as np

        out = win.copy()
        starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
        ends = np.r_[starts[1:], len(index)]
        for start, end in zip(starts[ends - starts > 1].tolist(), ends[ends - starts > 1].tolist()):
            lines = win[start:end].tolist()
            ids = [self._head(line)["episode_id"] for line in lines]
            out[start:end] = [line for _, line in sorted(zip(ids, lines))]
        return out

    # -- reading -----------------------------------------------------------------
    def _raw(self, line: int) -> bytes:
        return _pread(self.paths, self._fds, self._file[line], self._offset[line], self._length[line])

    def _read(self, line: int) -> dict[str, Any]:
        return with_token_lists(*self._read_packed(line))

    def _read_packed(self, line: int) -> tuple[dict[str, Any], bytes]:
        number = self._file[line]
        return _parse(self._raw(line), self.paths[number], self._offset[line], _blobs(self._blobs, self.paths, number))

    def _head(self, line: int) -> dict[str, Any]:
        head = read_head(self._raw(line))
        if head is None:
            raise LedgerChanged(f"line at byte {self._offset[line]} of {self.paths[self._file[line]]} "
                                "is not a ledger record")
        return head

    def records(self) -> Iterator[dict[str, Any]]:
        """Every episode's record, whole, in ``(index, episode_id)`` order; raises LedgerChanged for a line
        that is not a record after all."""
        for line in self._winners.tolist():
            yield self._read(line)

    def heads(self) -> Iterator[dict[str, Any]]:
        """Every episode's record without its trajectories, in ``(index, episode_id)`` order (the order of
        :meth:`records`; the token lists are not parsed)."""
        for line in self._winners.tolist():
            yield self._head(line)

    def record(self, position: int) -> dict[str, Any]:
        """The whole record at ``position`` of :meth:`records`' order; raises LedgerChanged as they do."""
        return self._read(int(self._winners[position]))

    def packed_records(self) -> Iterator[tuple[dict[str, Any], bytes]]:
        """Every episode's record as its line has it, with its checked blob (b"" when the line has none), in
        ``(index, episode_id)`` order; raises LedgerChanged as :meth:`records` does."""
        for line in self._winners.tolist():
            yield self._read_packed(line)

    def parts(self, count: int) -> list[LedgerSlice]:
        """The records of :meth:`records` cut into ``count`` consecutive slices of about equal length."""
        import numpy as np

        winners = self._winners
        bounds = np.linspace(0, len(winners), count + 1).astype(np.int64)
        files = np.frombuffer(self._file, dtype=np.int64) if self._file else np.zeros(0, np.int64)
        offsets = np.frombuffer(self._offset, dtype=np.int64) if self._offset else np.zeros(0, np.int64)
        lengths = np.frombuffer(self._length, dtype=np.int64) if self._length else np.zeros(0, np.int64)
        out = []
        for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            lines = winners[start:end]
            out.append(LedgerSlice([str(p) for p in self.paths], files[lines].tolist(), offsets[lines].tolist(),
                                   lengths[lines].tolist()))
        return out

    def line_order(self) -> list[int] | None:
        """When every line ``on_head`` saw is an episode's record (no episode has several lines): for each
        position of :meth:`records`' order, the number of the line ``on_head`` saw it as (0 for the first
        head it was given); else None."""
        if not self.exact or self.duplicates or self._winners is None:
            return None
        return self._winners.tolist()

    def heads_in_ledger_order(self) -> Iterator[dict[str, Any]]:
        """Every episode's record without its trajectories, in the order the episodes first appear."""
        for line in self._first.tolist():
            yield self._head(line)

    def close(self) -> None:
        _close(self._fds, self._blobs)

    def __enter__(self) -> LedgerIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LedgerSlice:
    """Some records of a :class:`LedgerIndex`, by place, in order: small enough to hand to another process."""

    def __init__(self, paths: list[str], files: list[int], offsets: list[int], lengths: list[int]):
        self.paths = paths
        self.files = files
        self.offsets = offsets
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.offsets)

    def records(self) -> Iterator[tuple[dict[str, Any], bytes]]:
        """The records as their lines have them, with their checked blobs; raises LedgerChanged for a line
        that is not a record."""
        paths = [Path(p) for p in self.paths]
        fds: dict[int, int] = {}
        blobs: dict[int, TokenFile] = {}
        try:
            for number, offset, length in zip(self.files, self.offsets, self.lengths):
                yield _parse(_pread(paths, fds, number, offset, length), paths[number], offset,
                             _blobs(blobs, paths, number))
        finally:
            _close(fds, blobs)


def _pread(paths: list[Path], fds: dict[int, int], number: int, offset: int, length: int) -> bytes:
    fd = fds.get(number)
    if fd is None:
        fd = fds[number] = open_nofollow(paths[number], os.O_RDONLY)
    raw = os.pread(fd, length, offset)
    if len(raw) != length:
        raise LedgerChanged(f"{paths[number]} is shorter than when it was indexed")
    return raw


def _blobs(files: dict[int, TokenFile], paths: list[Path], number: int) -> TokenFile:
    tokens = files.get(number)
    if tokens is None:
        tokens = files[number] = TokenFile(tokens_path(paths[number]))
    return tokens


def _parse(raw: bytes, path: Path, offset: int, blobs: TokenFile) -> tuple[dict[str, Any], bytes]:
    record = parse_record(raw)
    if record is None:
        raise LedgerChanged(f"line at byte {offset} of {path} is not a ledger record")
    if not is_packed(record):
        return record, b""
    try:
        blob = blobs.blob(record)
    except BadTokens as exc:
        raise LedgerChanged(f"line at byte {offset} of {path}: {exc}") from None
    return record, blob


def _close(fds: dict[int, int], blobs: dict[int, TokenFile] | None = None) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()
    for tokens in (blobs or {}).values():
        tokens.close()
    if blobs:
        blobs.clear()
