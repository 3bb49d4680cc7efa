"""Pages of a large file handed back to the OS once they are on disk (drop-behind).

A run writes its trajectories dataset once and does not read it back: gigabytes that would otherwise
fill the page cache, evicting what the machine does read (model weights, a task's data). On a virtual
machine whose free memory goes back to the host, every fresh page the cache takes also costs a fault on
the host: writing 3 GB measured 6-9 s of kernel time here, and 1.2 s when the pages were handed back
behind the writes (so the same few pages are used again).

:class:`DropBehind` follows a file as it grows: each :data:`STEP` bytes written are sent to disk
(Linux's ``sync_file_range``, which starts the writes and does not wait), and the bytes :data:`LAG`
behind the end are waited for and dropped from the cache (``posix_fadvise(DONTNEED)``). It only waits
on data written that long ago, so a disk as fast as the run never holds it back; a slower one does,
as the kernel's own limit on unwritten data would later. Nothing about the file's content, size or
durability changes (``fsync`` is still what makes a file durable). Best effort: where the calls are
missing (not Linux) or refused (a filesystem without them), nothing is done.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .files import libc_function

#: Bytes sent to disk at a time.
STEP = 32 << 20
#: How far behind the end of the file its bytes are dropped from the page cache.
LAG = 4 * STEP
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4  # SYNC_FILE_RANGE_*
_SYNC_FILE_RANGE: Any = None


def _sync_file_range() -> Any:
    """libc's ``sync_file_range(fd, offset, nbytes, flags)``, or False where there is none (or no fadvise)."""
    global _SYNC_FILE_RANGE
    if _SYNC_FILE_RANGE is None:
        call = libc_function("sync_file_range", ["c_int", "c_int64", "c_int64", "c_uint"], "c_int")
        _SYNC_FILE_RANGE = call if call is not None and hasattr(os, "posix_fadvise") else False
    return _SYNC_FILE_RANGE


class DropBehind:
    """Sends ``path``'s bytes to disk as another handle appends them, and drops them from the page cache
    :data:`LAG` bytes behind."""

    def __init__(self, path: Path | str, *, step: int = STEP, lag: int = LAG):
        self._fd: int | None = None
        self._step = step
        self._lag = max(lag, step)
        self._sent = 0  # bytes sent to disk
        self._dropped = 0  # bytes dropped from the cache
        if not _sync_file_range():
            return
        try:
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._fd = None

    def advance(self, end: int) -> None:
        """The file now holds ``end`` bytes (the bytes before it, at least)."""
        fd = self._fd
        if fd is None or end - self._sent < self._step:
            return
        call = _sync_file_range()
        try:
            if call(fd, self._sent, end - self._sent, _WRITE) != 0:
                raise OSError
            self._sent = end
            behind = end - self._lag
            if behind - self._dropped >= self._step:
                if call(fd, self._dropped, behind - self._dropped, _WAIT_BEFORE | _WRITE | _WAIT_AFTER) != 0:
                    raise OSError
                os.posix_fadvise(fd, self._dropped, behind - self._dropped, os.POSIX_FADV_DONTNEED)
                self._dropped = behind
        except OSError:  # not supported here: the file is written as usual
            self.close()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
