"""Launching a run's workers: local processes, Ray actors, or torchrun, all ending the same way.

``local`` (worker processes on this machine), ``ray`` (Ray actors),
``worker`` (the entry point every worker runs: ``python -m
scaffold_core.launch.worker``, torchrun-compatible) and ``results`` (how
workers end, merging their metrics, finalizing the run).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Config
from .local import LocalLauncher, default_threads
from .results import (
    PARENT_ENV,
    RESULT_ENV,
    WORKERS_DIR,
    WorkerResult,
    exit_description,
    finalize_run,
    merge_live,
    read_result,
    tail,
    worker_paths,
    write_result,
)


def run_workers(config: Config, *, output_dir: str | Path | None = None, resume: bool = False,
                progress: bool | None = None, force_config: bool = False,
                on_head: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the config on ``rollout.workers`` processes (or Ray actors); return the merged metrics.

    ``metrics["worker_failures"]`` lists failed workers by rank and shard. ``on_head``: given each record, as
    :func:`~scaffold_core.run.finalize.finalize_run_dir` exports it (a reporter counts them there).
    """
    if config.rollout.launcher == "ray":
        from .ray import run_ray  # imports ray lazily; keeps `scaffold run` fast without it

        return run_ray(config, output_dir=output_dir, resume=resume, progress=progress, force_config=force_config,
                       on_head=on_head)
    return LocalLauncher(config, output_dir=output_dir, resume=resume, progress=progress,
                         force_config=force_config).run(on_head)


__all__ = [
    "PARENT_ENV", "RESULT_ENV", "WORKERS_DIR", "LocalLauncher", "WorkerResult", "default_threads",
    "exit_description", "finalize_run", "merge_live", "read_result", "run_workers", "tail", "worker_paths",
    "write_result",
]
