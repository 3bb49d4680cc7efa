"""Writing files safely: never through a symbolic link, atomic replacement, private modes, children that
cannot escape their directory.

Every file a run writes is opened with ``O_NOFOLLOW`` (appends) or created under a fresh unique name
in its folder and renamed into place (whole-file writes); a link planted at any name the run writes is
refused with :class:`~scaffold_core.errors.RunDirError`, never followed. Files are created ``0600``
and folders ``0700`` unless ``output.private`` is false (then the umask decides).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ..errors import RunDirError

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def current_umask() -> int:
    """The process's umask, read without changing it (Linux), else by setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(private: bool = True) -> int:
    """Mode of a file the run creates: 0600, or what the umask allows."""
    return PRIVATE_FILE_MODE if private else 0o666 & ~current_umask()


def dir_mode(private: bool = True) -> int:
    """Mode of a folder the run creates: 0700, or what the umask allows."""
    return PRIVATE_DIR_MODE if private else 0o777 & ~current_umask()


def link_message(path: Path | str) -> str:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return (f"{path} is a symbolic link{target}; scaffold never writes or reads a run's files through a link. "
            f"Remove the link (rm {path}) or choose another output directory with -o")


def refuse_link(path: Path | str) -> None:
    """Raise RunDirError if ``path`` is a symbolic link (dangling or not)."""
    if os.path.islink(path):
        raise RunDirError(link_message(path), path=str(path))


def open_nofollow(path: Path | str, flags: int, mode: int = PRIVATE_FILE_MODE) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` with a clear RunDirError."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EMLINK and os.path.islink(path)):
            raise RunDirError(link_message(path), path=str(path)) from None
        raise


def open_append(path: Path | str, *, private: bool = True) -> int:
    """A write-only append descriptor of ``path`` (created if missing), never through a link."""
    return open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, file_mode(private))


def make_dir(path: Path, *, private: bool = True) -> None:
    """Create the folder ``path`` (0700 unless shared) if missing; refuse a link or a file in its place."""
    refuse_link(path)
    path.mkdir(mode=dir_mode(private), parents=True, exist_ok=True)
    refuse_link(path)
    if not path.is_dir():
        raise RunDirError(f"{path} is not a folder; move it away or choose another output directory with -o",
                          path=str(path))


@contextmanager
def atomic_writer(path: Path, *, private: bool = True, binary: bool = False, durable: bool = True
                  ) -> Iterator[IO[Any]]:
    """A file handle whose content replaces ``path`` when the block ends without an error.

    It writes a fresh file with a unique name in the same folder (``O_EXCL``: never an existing file or
    link) and renames it over ``path``, which replaces a link at ``path`` instead of following it.
    ``durable``: fsync before the rename (skip for files that can be derived again).
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        if not private:
            os.fchmod(fd, file_mode(False))
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_text(path: Path, text: str, *, private: bool = True) -> None:
    """Replace ``path`` with ``text`` atomically (temp file, fsync, rename); never through a link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path, private=private) as fh:
        fh.write(text)


def fresh_dir(parent: Path, name: str, *, private: bool = True) -> Path:
    """A new empty folder with a unique name starting with ``.name.`` in ``parent``."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=parent))
    if not private:
        os.chmod(tmp, dir_mode(False))
    return tmp


def set_tree_modes(root: Path, *, private: bool = True) -> None:
    """Give every file and folder under ``root`` the run's modes (links are left alone)."""
    fmode, dmode = file_mode(private), dir_mode(private)
    for here, dirs, files in os.walk(root):
        os.chmod(here, dmode)
        for name in files:
            full = os.path.join(here, name)
            if not os.path.islink(full):
                os.chmod(full, fmode)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(here, d))]


def replace_dir(tmp: Path, target: Path) -> None:
    """Move the folder ``tmp`` to ``target``, removing what was there (a folder or file, never through a link)."""
    refuse_link(target)
    if target.is_dir():
        shutil.rmtree(target)
    elif target.exists():
        target.unlink()
    os.replace(tmp, target)


def remove_stale_temps(directory: Path, names: Iterable[str]) -> None:
    """Remove what an interrupted write left: ``.NAME.*`` temp files and folders of the given names
    (a link is removed itself, never followed)."""
    prefixes = tuple(f".{name}." for name in names)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(prefixes):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def safe_child(root: Path, name: str) -> Path:
    """``root / name``, refusing names that would escape ``root`` (``..``, absolute paths). A link at
    ``root / name`` is not followed here: writers refuse it (:func:`open_nofollow`)."""
    base = root.resolve()
    child = Path(os.path.normpath(base / name))
    if base not in (child, *child.parents):
        raise ValueError(f"output path {name!r} escapes the output directory {root}")
    return child
