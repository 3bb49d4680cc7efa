"""Joining the parts a run's processes wrote while they ran (:mod:`.live`) into the run's derived files.

:func:`join_parts` first checks that the parts cover the ledgers exactly: every ledger of the
directory was written from its first byte to its last by the session whose part it is, the parts
hold no episode twice and their datasets have the same columns. Then one segment in all (a
one-process run whose episodes finished nearly in order) is renamed into place, and several (the
workers of a multi-worker run, or stragglers) are merged by index: their lines and dataset rows are
copied, a window at a time, into the order ``(index, episode_id)`` a one-process run writes. When
the check fails nothing is written and the caller derives the files from the ledgers instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .derived import DerivedWriter, TrajectoryDatasetWriter, _fresh_file
from .files import open_nofollow
from .live import FIELDS, MANIFEST

#: A merge window: at most this many episodes, dataset rows and tokens are held at once.
WINDOW_EPISODES = 8192
WINDOW_ROWS = 4096
WINDOW_TOKENS = 1 << 22


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A finished part's manifest, or None when the folder holds none (its process did not finish)."""
    try:
        with os.fdopen(open_nofollow(folder / MANIFEST, os.O_RDONLY), "rb") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def join_parts(directory: Path, parts: Iterable[Path], ledgers: list[Path], *, save_dataset: bool,
               private: bool = True) -> list[dict[str, Any]] | None:
    """Write samples.jsonl, failures.jsonl and the dataset from the parts when they cover ``ledgers``
    exactly; returns their manifests (with the totals of their records), or None (nothing written)."""
    import numpy as np

    folders = [Path(p) for p in parts]
    manifests = [read_manifest(f) for f in folders]
    if not folders or any(m is None for m in manifests):
        return None
    if not _covers(manifests, ledgers, save_dataset):  # type: ignore[arg-type]
        return None
    if not all(isinstance(m.get("metrics"), dict) for m in manifests):  # type: ignore[union-attr]
        return None
    segments: list[tuple[Path, dict[str, Any], Any]] = []
    for folder, manifest in zip(folders, manifests):
        for seg in manifest["segments"]:  # type: ignore[index]
            episodes = np.load(folder / seg["folder"] / "episodes.npy")
            segments.append((folder / seg["folder"], seg, episodes.reshape(len(FIELDS), -1)))
    with_rows = [seg for _, seg, e in segments if e[4].any()]  # the dataset's columns: those of segments with rows
    columns = {json.dumps(seg["kinds"]) for seg in with_rows}  # their order counts too
    if save_dataset and (any(seg["stale"] for _, seg, _ in segments) or len(columns) > 1):
        return None
    indexes = np.concatenate([e[0] for _, _, e in segments]) if segments else np.zeros(0, np.int64)
    hashes = np.concatenate([e[1] for _, _, e in segments]) if segments else np.zeros(0, np.int64)
    if _repeats(indexes) or _repeats(hashes):
        return None  # an episode twice (or two at one index): the ledgers decide which record counts
    kinds = with_rows[0]["kinds"] if with_rows else None
    if not segments:  # no episode at all
        DerivedWriter(directory, save_dataset, private=private).finish(None)
    elif len(segments) == 1:
        _rename(directory, segments[0], save_dataset, kinds, private)
    else:
        _merge(directory, segments, save_dataset, kinds, private)
    return manifests  # type: ignore[return-value]


def _repeats(values: Any) -> bool:
    import numpy as np

    ordered = np.sort(values)
    return bool(len(ordered) > 1 and (ordered[1:] == ordered[:-1]).any())


def _covers(manifests: list[dict[str, Any]], ledgers: list[Path], save_dataset: bool) -> bool:
    """Whether the parts' ledgers are exactly ``ledgers``, each written whole by the part's session."""
    names = [m.get("ledger") for m in manifests]
    if sorted(map(str, names)) != sorted(p.name for p in ledgers) or len(set(names)) != len(names):
        return False
    by_name = {p.name: p for p in ledgers}
    for manifest in manifests:
        if manifest.get("start") != 0 or bool(manifest.get("save_dataset")) != bool(save_dataset):
            return False
        try:
            size = os.lstat(by_name[manifest["ledger"]]).st_size
        except OSError:
            return False
        if size != manifest.get("end"):
            return False
    return True


def _rename(directory: Path, segment: tuple[Path, dict[str, Any], Any], save_dataset: bool,
            kinds: dict[str, str] | None, private: bool) -> None:
    folder, seg, _ = segment
    if save_dataset:
        dataset = TrajectoryDatasetWriter(directory, kinds, private=private)
        try:
            dataset.adopt([folder / s for s in seg["shards"]], {}, kinds)
            dataset.finish()
        except BaseException:
            dataset.abort()
            raise
    os.replace(folder / "samples.part", directory / "samples.jsonl")
    os.replace(folder / "failures.part", directory / "failures.jsonl")


class _Lines:
    """A segment's lines, read in order by byte counts."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.offset = 0

    def read(self, size: int) -> bytes:
        data = os.pread(self.fd, size, self.offset) if size else b""
        if len(data) != size:
            raise OSError("a derived part is shorter than its manifest says")
        self.offset += size
        return data

    def close(self) -> None:
        os.close(self.fd)


class _Rows:
    """A segment's dataset rows, read in order (its shards one after the other)."""

    def __init__(self, shards: list[Path]):
        self.shards = list(shards)
        self.batches: list[Any] = []
        self.reader: Any = None

    def read(self, count: int) -> list[Any]:
        import pyarrow as pa

        out = []
        while count > 0:
            if not self.batches:
                self._more(pa)
            batch = self.batches[0]
            if batch.num_rows <= count:
                out.append(self.batches.pop(0))
                count -= batch.num_rows
            else:
                out.append(batch.slice(0, count))
                self.batches[0] = batch.slice(count)
                count = 0
        return out

    def _more(self, pa: Any) -> None:
        while True:
            if self.reader is None:
                if not self.shards:
                    raise OSError("a derived part has fewer dataset rows than its manifest says")
                self.reader = pa.ipc.open_stream(pa.OSFile(str(self.shards.pop(0)), "r"))
            try:
                self.batches.append(self.reader.read_next_batch())
                return
            except StopIteration:
                self.reader = None


def _merge(directory: Path, segments: list[tuple[Path, dict[str, Any], Any]], save_dataset: bool,
           kinds: dict[str, str] | None, private: bool) -> None:
    """The segments' records merged by index into the run's files (each segment is read once, in order)."""
    import numpy as np

    which = np.concatenate([np.full(e.shape[1], i, np.int64) for i, (_, _, e) in enumerate(segments)])
    order = np.argsort(np.concatenate([e[0] for _, _, e in segments]), kind="stable")
    which = which[order]
    table = np.concatenate([e for _, _, e in segments], axis=1)[:, order]  # FIELDS x episodes, in output order
    samples_path, samples = _fresh_file(directory, "samples.jsonl", private)
    failures_path, failures = _fresh_file(directory, "failures.jsonl", private)
    readers = [(_Lines(folder / "samples.part"), _Lines(folder / "failures.part")) for folder, _, _ in segments]
    rows = [_Rows([folder / s for s in seg["shards"]]) for folder, seg, _ in segments] if save_dataset else []
    dataset = TrajectoryDatasetWriter(directory, kinds, private=private) if save_dataset else None
    try:
        start = 0
        for end in _windows(table):
            part = table[:, start:end]
            _copy_lines(which[start:end], part[2], [r[0] for r in readers], samples)
            _copy_lines(which[start:end], part[3], [r[1] for r in readers], failures)
            if dataset is not None:
                _copy_rows(which[start:end], part[4], rows, dataset)
            start = end
        samples.close()
        failures.close()
        if dataset is not None:
            dataset.finish()
            dataset = None
        os.replace(samples_path, directory / "samples.jsonl")
        os.replace(failures_path, directory / "failures.jsonl")
    finally:
        for fh in (samples, failures):
            fh.close()
        for lines in readers:
            lines[0].close()
            lines[1].close()
        if dataset is not None:
            dataset.abort()
        samples_path.unlink(missing_ok=True)
        failures_path.unlink(missing_ok=True)


def _windows(table: Any) -> Iterable[int]:
    """Ends of consecutive windows of episodes, each within the episode, row and token bounds."""
    import numpy as np

    n = table.shape[1]
    rows = np.cumsum(table[4])
    tokens = np.cumsum(table[5])
    start = 0
    while start < n:
        base_rows = rows[start - 1] if start else 0
        base_tokens = tokens[start - 1] if start else 0
        end = min(n, start + WINDOW_EPISODES,
                  int(np.searchsorted(rows, base_rows + WINDOW_ROWS, side="right")),
                  int(np.searchsorted(tokens, base_tokens + WINDOW_TOKENS, side="right")))
        end = max(end, start + 1)
        yield end
        start = end


#: Bytes of lines gathered at once (with an index of 8 bytes per byte).
GATHER_BYTES = 4 << 20


def _copy_lines(which: Any, sizes: Any, readers: list[_Lines], out: Any) -> None:
    """This window's lines in episode order: each segment's bytes read in one piece, then gathered by episode
    (numpy; no Python work per episode)."""
    import numpy as np

    if not sizes.any():
        return
    data = np.frombuffer(b"".join(reader.read(int(sizes[which == i].sum())) for i, reader in enumerate(readers)),
                         dtype=np.uint8)
    start = _starts(which, sizes, len(readers))  # each episode's first byte in ``data``
    ends = np.cumsum(sizes)
    first = 0
    while first < len(sizes):  # a few MB at a time: the index is 8 bytes per byte
        base = int(ends[first - 1]) if first else 0
        last = max(first + 1, int(np.searchsorted(ends, base + GATHER_BYTES, side="right")))
        part = sizes[first:last]
        index = np.repeat(start[first:last] - (np.cumsum(part) - part), part) + np.arange(int(part.sum()))
        out.write(data[index].tobytes())
        first = last


def _starts(which: Any, counts: Any, segments: int) -> Any:
    """Where each episode's items (bytes, rows) begin among its window's items laid out segment by segment."""
    import numpy as np

    start = np.zeros(len(which), np.int64)
    base = 0
    for i in range(segments):
        mine = np.flatnonzero(which == i)
        if len(mine):
            mine_counts = counts[mine]
            start[mine] = base + np.cumsum(mine_counts) - mine_counts
            base += int(mine_counts.sum())
    return start


def _copy_rows(which: Any, rows: Any, readers: list[_Rows], dataset: TrajectoryDatasetWriter) -> None:
    """This window's dataset rows in episode order: each segment's rows read in one piece, then put in order."""
    import numpy as np
    import pyarrow as pa

    if not rows.any():
        return
    batches = []
    for i, reader in enumerate(readers):
        batches.extend(reader.read(int(rows[which == i].sum())))
    start = np.repeat(_starts(which, rows, len(readers)), rows)
    step = np.arange(len(start)) - np.repeat(np.cumsum(rows) - rows, rows)
    table = pa.Table.from_batches(batches, schema=batches[0].schema)
    order = np.ascontiguousarray(start + step, dtype=np.int64)
    for batch in table.take(pa.Array.from_buffers(pa.int64(), len(order), [None, pa.py_buffer(order)])).to_batches():
        dataset.write_batch(batch)
