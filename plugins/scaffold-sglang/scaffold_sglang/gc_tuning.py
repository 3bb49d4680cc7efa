"""Fewer young-generation garbage collections while an engine runs (option ``gc_threshold``).

With a thousand requests in flight, every HTTP round trip allocates dozens
of container objects, and CPython's default first-generation threshold (700
allocations) makes the cyclic collector run thousands of times a second:
measured here, about a third of the client's CPU time. While at least one
engine is started, the first-generation threshold is raised (never lowered)
to ``gc_threshold``; the previous thresholds come back when the last engine
closes. Collections still run, just less often, so garbage cycles are still
freed.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_users = 0
_saved: tuple[int, int, int] | None = None
_applied: tuple[int, int, int] | None = None


def acquire(threshold: int | None) -> bool:
    """Raise the first-generation threshold to ``threshold`` (None: leave the GC alone). Returns whether held."""
    global _users, _saved, _applied
    if threshold is None:
        return False
    with _lock:
        current = gc.get_threshold()
        if _users == 0:
            _saved = current
            if threshold > current[0]:
                _applied = (threshold, *current[1:])
                gc.set_threshold(*_applied)
            else:
                _applied = None
        _users += 1
    return True


def release() -> None:
    """Undo :func:`acquire` once; the last release restores the thresholds (unless someone changed them)."""
    global _users, _saved, _applied
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            if _applied is not None and gc.get_threshold() == _applied and _saved is not None:
                gc.set_threshold(*_saved)
            _saved = _applied = None
