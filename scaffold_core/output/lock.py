"""One run per output directory: an exclusive OS lock held by the process that owns the run.

``scaffold run`` (or its launcher, for several workers) takes ``fcntl.flock`` on ``DIR/.scaffold.lock``
before it looks at the directory and holds it until it has written its last file. The kernel releases
the lock when the holder exits in any way (SIGKILL included), so a lock is never stale: a run after a
crash simply takes it. A second run on the same directory, or a ``--resume`` while the first still
runs, is refused with the holder's pid and host (written into the lock file for that message).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from ..errors import RunLockedError
from .files import file_mode, open_nofollow

LOCK_FILE = ".scaffold.lock"


class RunLock:
    """The exclusive lock of one output directory (``acquire`` raises RunLockedError when held)."""

    def __init__(self, directory: Path, *, private: bool = True):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.private = private
        self._file: Any = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> RunLock:
        fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, file_mode(self.private))
        handle = os.fdopen(fd, "r+b", buffering=0)  # closed (and the lock released) on any exit or collection
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(handle)
            handle.close()
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            pid, host = holder.get("pid"), holder.get("host")
            since = f", since {holder['started']}" if holder.get("started") else ""
            who = f"pid {pid} on host {host}{since}" if pid else "a process that did not say who it is"
            raise RunLockedError(
                f"output.dir: {self.directory} is in use by another scaffold run ({who}). Wait for it to end "
                "or stop it, then run again (--resume continues it); or choose another directory with -o",
                path=str(self.path), pid=pid if isinstance(pid, int) else None,
                host=host if isinstance(host, str) else None) from None
        handle.truncate(0)
        handle.write((json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n").encode())
        self._file = handle
        return self

    def release(self) -> None:
        """Give the directory back (closing the file releases the lock; the file stays, harmless)."""
        if self._file is not None:
            try:
                self._file.close()
            finally:
                self._file = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(handle: Any) -> dict[str, Any]:
    try:
        handle.seek(0)
        data = json.loads(handle.read(4096) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
