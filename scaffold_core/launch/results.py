"""How workers end and what their launcher makes of it: results, logs, merged metrics.

Every launcher (local processes, Ray actors, torchrun) ends the same way:
each worker leaves a :class:`WorkerResult` (its live metrics, or why it
failed), the launcher merges them with :func:`merge_live`, and
:func:`finalize_run` merges the workers' stores, exports the run's files
and writes its metrics.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ScaffoldError
from ..output import atomic_write_text, rank_store_name
from ..output.files import open_nofollow
from ..plugins import get_plugins
from ..plugins.lifecycle import Hooks
from ..run.finalize import finalize_run_dir
from ..run.metrics import RunMetrics

WORKERS_DIR = "workers"
#: Where a launched worker writes its result (set by the launcher).
RESULT_ENV = "SCAFFOLD_WORKER_RESULT"
#: The launcher's pid; a worker exits when its launcher dies.
PARENT_ENV = "SCAFFOLD_LAUNCHER_PID"
TAIL_CHARS = 4000


def exit_description(code: int | None) -> str:
    """``exited with code 3`` / ``killed by signal SIGKILL`` / ``did not exit``."""
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code == 0:
        return "exited with code 0 but wrote no result"
    return f"exited with code {code}"


@dataclass
class WorkerResult:
    """How one worker ended: its live metrics when it finished, else why it failed."""

    rank: int
    world_size: int
    live: dict[str, Any] | None = None
    exit_code: int | None = None
    error: str | None = None
    log: str | None = None
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.live is not None

    @property
    def shard(self) -> str:
        return f"rows with index % {self.world_size} == {self.rank} (store {rank_store_name(self.rank)})"

    def failure(self) -> dict[str, Any]:
        return {"rank": self.rank, "shard": self.shard, "exit_code": self.exit_code, "error": self.error,
                "log": self.log, "log_tail": self.log_tail}


def worker_paths(output_dir: Path, rank: int) -> tuple[Path, Path]:
    """(log file, result file) of worker ``rank``."""
    base = Path(output_dir) / WORKERS_DIR / f"rank-{rank:05d}"
    return base.with_suffix(".log"), base.with_suffix(".json")


def write_result(path: Path, live: dict[str, Any] | None, error: str | None = None, *, private: bool = True) -> None:
    """A worker's last word: its live metrics, or the error that stopped it (atomic: never through a link)."""
    atomic_write_text(path, json.dumps({"live": live, "error": error}, default=str) + "\n", private=private)


def read_result(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(live metrics, error) a worker left at ``path``; (None, None) when missing, a link or not a result."""
    try:
        with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError, ScaffoldError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    live, error = data.get("live"), data.get("error")
    return (live if isinstance(live, dict) else None), (None if error is None else str(error))


def tail(path: Path | str | None, chars: int = TAIL_CHARS) -> str:
    """The last ``chars`` characters of a text file ('' when missing)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - chars))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def merge_live(results: list[WorkerResult]) -> dict[str, Any]:
    """One run's live metrics from the workers': session counts summed, throughput over the slowest worker."""
    done = [r for r in results if r.live is not None]
    live: dict[str, Any] = {"episodes": 0, "completed": 0, "failed": 0, "generated_tokens": 0}
    wall = max((float(r.live.get("wall_s", 0.0)) for r in done), default=0.0)  # type: ignore[union-attr]
    workers = []
    resumed = 0
    hook_errors: dict[str, Any] = {}
    for r in done:
        lv = r.live or {}
        for key in ("episodes", "completed", "failed", "generated_tokens"):
            live[key] += int(lv.get(key, 0))
        resumed += int(lv.get("resumed_episodes", 0))
        hook_errors.update(lv.get("hook_errors") or {})
        if lv.get("interrupted") and "interrupted" not in live:
            live["interrupted"] = lv["interrupted"]
        workers.append({"rank": r.rank, **{k: lv.get(k) for k in ("episodes", "completed", "failed", "wall_s",
                                                                   "episodes_per_s", "tokens_per_s")},
                        "engine": lv.get("engine") or {}})
    live["wall_s"] = round(wall, 3)
    live["episodes_per_s"] = round(live["episodes"] / wall, 3) if wall > 0 else 0.0
    live["tokens_per_s"] = round(live["generated_tokens"] / wall, 3) if wall > 0 else 0.0
    if resumed:
        live["resumed_episodes"] = resumed
    if hook_errors:
        live["hook_errors"] = hook_errors
    live["workers"] = {"count": len(results), "per_worker": sorted(workers, key=lambda w: w["rank"])}
    failures = [r.failure() for r in sorted(results, key=lambda r: r.rank) if not r.ok]
    if failures:
        live["worker_failures"] = failures
    return live


def merged_skipped_rows(results: list[WorkerResult]) -> dict[str, int]:
    """Skipped-row counts: every worker loads (and counts) the whole dataset, so take the maximum."""
    out: dict[str, int] = {}
    for r in results:
        for reason, count in ((r.live or {}).get("skipped_rows") or {}).items():
            out[reason] = max(out.get(reason, 0), int(count))
    return out


def finalize_run(config: Any, output_dir: Path, results: list[WorkerResult], *,
                 extra_live: dict[str, Any] | None = None, launcher: str = "local",
                 launcher_wall_s: float | None = None,
                 on_head: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Merge the workers' stores of ``output_dir``, export the run's files and metrics.json; returns the metrics."""
    live = merge_live(results)
    live.update(extra_live or {})
    live["workers"]["launcher"] = launcher
    if launcher_wall_s is not None:  # start-up (model loading) included
        live["workers"]["launcher_wall_s"] = round(launcher_wall_s, 3)
    states = [r.live.get("totals") for r in results if r.live is not None]
    sessions = (RunMetrics.from_states(states)  # type: ignore[arg-type]
                if all(r.ok for r in results) and all(isinstance(s, dict) for s in states) else None)
    return finalize_run_dir(Path(output_dir), live, hooks=Hooks(get_plugins().pm),
                            save_dataset=config.output.save_dataset, save_parquet=config.output.save_parquet,
                            skipped_rows=merged_skipped_rows(results),
                            private=config.output.private, sessions=sessions, on_head=on_head)

