"""What a resumed run must match: the config saved in ``DIR/config.yaml``.

``--resume`` compares the resolved config (every default filled in) with the saved one, key by key.
Keys that only say how the run is executed, not what it computes, may change
(:data:`RESUME_MAY_CHANGE`); any other change is refused with the list of changed keys, so two
experiments never mix in one run directory. ``--force-config`` continues anyway: loudly, and the
change is appended to ``DIR/config-history.jsonl``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import RunDirError
from .codec import one_line
from .files import open_append, open_nofollow, refuse_link

CONFIG_FILE = "config.yaml"
CONFIG_HISTORY = "config-history.jsonl"

#: Keys a resumed run may change (a key or a whole section prefix): workers, launchers, timeouts,
#: progress and output-only options. Everything else decides what the episodes are.
RESUME_MAY_CHANGE: tuple[str, ...] = (
    "rollout.concurrency", "rollout.workers", "rollout.launcher", "rollout.ray_address", "rollout.ray_num_cpus",
    "rollout.ray_num_gpus", "rollout.ray_startup_timeout", "rollout.retries", "rollout.request_timeout",
    "rollout.episode_timeout", "rollout.shutdown_timeout", "rollout.worker_timeout", "rollout.progress",
    "rollout.bad_rows", "rollout.max_failed_fraction",
    "verifier.timeout", "verifier.workers",
    "output.dir", "output.overwrite", "output.save_dataset", "output.save_parquet", "output.private",
    "trainer.rollout_timeout", "trainer.report_to",
)
ABSENT = "(absent)"
SHOWN_KEYS = 8


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def may_change(key: str) -> bool:
    return any(key == allowed or key.startswith(allowed + ".") for allowed in RESUME_MAY_CHANGE)


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """key -> (saved value, current value) for every key that differs and may not change on resume."""
    old, new = flatten(saved), flatten(current)
    changes = {}
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, ABSENT), new.get(key, ABSENT)
        if before != after and not may_change(key):
            changes[key] = (before, after)
    return changes


def _short(value: Any) -> str:
    text = value if value is ABSENT else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(changes: dict[str, tuple[Any, Any]]) -> str:
    """``task.limit: 10 -> 20; sampling.temperature: 0.7 -> 1.0`` (the first few keys, then a count)."""
    items = [f"{key}: {_short(a)} -> {_short(b)}" for key, (a, b) in list(changes.items())[:SHOWN_KEYS]]
    more = len(changes) - SHOWN_KEYS
    return "; ".join(items) + (f"; and {more} more" if more > 0 else "")


def read_saved_config(path: Path) -> dict[str, Any]:
    """The config saved at ``path``; RunDirError (one line: file, line, fix) if it is a link, unreadable,
    not UTF-8, not YAML, or not a config."""
    import yaml

    refuse_link(path)
    fix = "restore it, or pass --force-config to replace it with this run's config"
    try:
        fd = open_nofollow(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise RunDirError(f"{path}: cannot be read ({exc.strerror}); {fix}", path=str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise RunDirError(f"{path}:{line}: damaged (byte 0x{raw[exc.start]:02x} is not UTF-8); it records the run's "
                          f"config: {fix}", path=str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise RunDirError(f"{path}{where}: not valid YAML ({problem}); it records the run's config: {fix}",
                          path=str(path)) from None
    if not isinstance(data, dict) or not isinstance(data.get("task"), dict):
        raise RunDirError(f"{path}: not a saved scaffold config (no task section); it records the run's config: "
                          f"{fix}", path=str(path))
    return data


def check_resume_config(directory: Path, config: Any, *, force: bool = False,
                        command: str = "run") -> dict[str, tuple[Any, Any]]:
    """Compare ``config`` with the one saved in ``directory``; refuse a change unless ``force``.

    Returns the changes continued with (``force``), or ``{}``. ``command``: the ``scaffold`` command the
    refusal tells to resume with.
    """
    import yaml

    path = directory / CONFIG_FILE
    if not os.path.lexists(path):
        return {}
    current = yaml.safe_load(config.to_yaml())
    try:
        saved = read_saved_config(path)
    except RunDirError as exc:
        if not force:
            raise
        changes: dict[str, tuple[Any, Any]] = {CONFIG_FILE: (str(exc), "replaced")}
    else:
        changes = config_changes(saved, current)
    if not changes:
        return {}
    history = directory / CONFIG_HISTORY
    if not force:
        raise RunDirError(
            f"--resume: {path} holds a different config than this run: {describe(changes)}. Resume with the saved "
            f"config (scaffold {command} {path} -o {directory} --resume), start a new run in another directory with "
            f"-o, or pass --force-config to continue anyway (recorded in {history})", path=str(path))
    print(f"scaffold: WARNING: --force-config: resuming {directory} with a changed config ({describe(changes)}); "
          f"its episodes before and after the change are mixed; recorded in {history}", file=sys.stderr)
    return changes


def record_forced_change(directory: Path, changes: dict[str, tuple[Any, Any]], *, private: bool = True) -> None:
    """Append the changes a ``--force-config`` resume continued with to ``config-history.jsonl``."""
    record = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "host": socket.gethostname(), "pid": os.getpid(),
              "forced": True, "changed": {k: {"saved": a, "now": b} for k, (a, b) in changes.items()}}
    fd = open_append(directory / CONFIG_HISTORY, private=private)
    try:
        os.write(fd, one_line(json.dumps(record, default=str, ensure_ascii=False).encode("utf-8")) + b"\n")
    finally:
        os.close(fd)
