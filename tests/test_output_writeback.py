"""Drop-behind: a file written once has its pages handed back once they are on disk, and reads exactly as
written; where the calls are missing or refused, nothing changes."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

import pytest

from scaffold_core.output import writeback
from scaffold_core.output.writeback import DropBehind

MB = 1 << 20
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")


def resident(path, start: int, length: int) -> int:
    """How many of the pages of ``path`` in [start, start + length) are in the page cache (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as view:  # mapped, never written
        pages = (length + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        first = ctypes.c_char.from_buffer(view)  # the mapping's first byte (a borrowed buffer)
        try:
            code = libc.mincore(ctypes.c_void_p(ctypes.addressof(first) + start), ctypes.c_size_t(length), vec)
        finally:
            del first
        if code != 0:
            pytest.skip("mincore is not available here")
        return sum(b & 1 for b in vec)


def write_through(path, data: bytes, step: int, lag: int) -> None:
    with open(path, "wb") as fh:
        behind = DropBehind(path, step=step, lag=lag)
        for start in range(0, len(data), MB):
            fh.write(data[start:start + MB])
            fh.flush()
            behind.advance(start + MB)
        behind.close()
        behind.close()  # closing twice is harmless


@linux_only
def test_pages_behind_the_end_leave_the_cache_and_the_file_reads_exactly_as_written(tmp_path):
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * MB)
    fd = os.open(probe, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, MB, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if resident(probe, 0, MB) * mmap.PAGESIZE >= MB:
        pytest.skip("this filesystem keeps written pages in memory (tmpfs)")
    data = os.urandom(24 * MB)
    path = tmp_path / "shard.arrow"
    write_through(path, data, step=2 * MB, lag=4 * MB)
    dropped = resident(path, 0, 16 * MB) * mmap.PAGESIZE  # all of it lies at least the lag behind the end
    assert dropped < 2 * MB, f"{dropped} bytes of the first 16 MB are still cached"
    assert path.read_bytes() == data


def test_where_the_calls_are_missing_or_refused_nothing_changes(tmp_path, monkeypatch):
    data = os.urandom(8 * MB)
    monkeypatch.setattr(writeback, "_SYNC_FILE_RANGE", False)  # not Linux
    write_through(tmp_path / "a", data, step=MB, lag=2 * MB)
    assert (tmp_path / "a").read_bytes() == data

    def refuse(fd, offset, length, flags):
        ctypes.set_errno(22)
        return -1

    monkeypatch.setattr(writeback, "_SYNC_FILE_RANGE", refuse)  # a filesystem that refuses it
    behind = DropBehind(tmp_path / "a", step=MB, lag=2 * MB)
    behind.advance(4 * MB)
    assert behind._fd is None  # gave up, and said nothing
    assert (tmp_path / "a").read_bytes() == data
