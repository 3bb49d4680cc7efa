"""Writing files safely: atomic replacement, and children that cannot escape their directory."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def safe_child(root: Path, name: str) -> Path:
    """``root / name``, refusing names that would escape ``root``."""
    child = (root / name).resolve()
    if root.resolve() not in (child, *child.parents):
        raise ValueError(f"output path {name!r} escapes the output directory {root}")
    return child
