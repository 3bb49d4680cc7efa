"""One worker of a multi-worker rollout: ``python -m scaffold_core.launch.worker CONFIG [-o DIR] [--resume]``.

It reads its place from torchrun's variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``),
runs the rows with ``index % WORLD_SIZE == RANK`` on its own engine and
appends them to ``episodes.rank-<RANK>.jsonl`` in the output directory. Two
ways to start it:

* **by scaffold** (``scaffold run --workers N``, Ray): the launcher prepared
  the directory, sets ``SCAFFOLD_WORKER_RESULT``, and merges the shards when
  every worker has ended. The worker writes its live metrics there and exits.
* **by torchrun** (or any launcher setting those variables), across machines
  sharing the output directory::

      torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:PORT \\
          -m scaffold_core.launch.worker run.yaml -o /shared/runs/x

  The ranks meet on a Gloo group (every wait bounded by
  ``rollout.worker_timeout``): rank 0 prepares the directory and shares its
  path, every rank runs its shard, and rank 0 merges and writes the metrics.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import load_config
from ..distributed.env import DistEnv
from ..distributed.groups import all_gather_objects, broadcast_object, init_process_group
from ..errors import ScaffoldError
from ..output import RunOutput, expand_output_dir, rank_store_name
from ..run.arguments import add_run_arguments
from ..run.rollout import Rollout
from ..run.summary import ExitCode, exit_code_for, print_summary, report_failures
from .results import PARENT_ENV, RESULT_ENV, WorkerResult, finalize_run, write_result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scaffold_core.launch.worker",
                                description="Run one rank's shard of a scaffold rollout (torchrun-compatible).")
    add_run_arguments(p)  # the output directory is shared by every rank; rank 0 prepares it
    p.add_argument("--progress", action="store_true", help="show this rank's progress bar")
    return p


#: How often a launched worker checks that its launcher is alive.
PARENT_POLL_S = 0.2


def die_with_parent() -> None:
    """When started by scaffold's launcher, stop at once (within ~PARENT_POLL_S) if the launcher dies.

    A launcher that ends normally stops its workers gracefully itself; one that is SIGKILLed cannot, and
    its workers must not go on running (or draining for ``rollout.shutdown_timeout``) into a directory
    nobody holds. A watcher thread notices the launcher is gone (the worker was re-parented) and kills
    the worker's own process group with SIGKILL: the worker and the children it started in its group.
    Servers started in their own groups watch the worker in turn (the SGLang launcher's parent-death
    signal). Finished episodes are already in the store; ``--resume`` redoes those in flight.
    """
    parent = os.environ.get(PARENT_ENV)
    if not parent or not parent.isdigit():
        return
    watcher = threading.Thread(target=_watch_parent, args=(int(parent),), name="scaffold-launcher-watch",
                               daemon=True)
    watcher.start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    _stop_now()


def _stop_now() -> None:
    """Kill this worker and its process group at once (no drain, no cleanup: the launcher is gone)."""
    try:
        os.write(2, b"scaffold worker: the launcher is gone; stopping now\n")
    except OSError:  # the log pipe went with the launcher
        pass
    if os.getpgrp() == os.getpid():  # the launcher starts each worker as its own group's leader
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def run_shard(config: Any, output_dir: Path, env: Any, *, resume: bool, progress: bool | None) -> dict[str, Any]:
    """Run this rank's rows into its own store; returns its live metrics (no merge)."""
    rollout = Rollout(config, output_dir=output_dir, resume=resume, dist=env, store_name=rank_store_name(env.rank),
                      finalize=False, prepared=True, progress=progress)
    live = rollout.run()
    live["skipped_rows"] = dict(rollout.metrics.skipped_rows)
    live["rank"] = env.rank
    return live


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    die_with_parent()
    result_path = os.environ.get(RESULT_ENV)
    try:
        env = DistEnv.from_env()
        overrides = list(args.overrides) + (["output.overwrite=true"] if args.overwrite else [])
        config = load_config(args.config, overrides)
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if result_path:
            write_result(Path(result_path), None, str(exc))
        return ExitCode.ERROR
    progress = True if args.progress else False
    if result_path:
        return _launched(config, args, env, Path(result_path), progress)
    if not env.launched or env.world_size == 1:
        metrics = Rollout(config, output_dir=args.output, resume=args.resume, progress=progress or None,
                          force_config=args.force_config).run()
        print_summary(metrics, as_json=True)  # a worker entry point, read by scripts
        return exit_code_for(metrics, config.rollout.max_failed_fraction)
    return _standalone(config, args, env, progress)


def _launched(config: Any, args: argparse.Namespace, env: Any, result_path: Path, progress: bool) -> int:
    """Started by scaffold's launcher: run the shard, write the result, exit."""
    if not args.output:
        write_result(result_path, None, "the launcher must pass -o DIR")
        return ExitCode.ERROR
    private = config.output.private
    try:
        live = run_shard(config, Path(args.output), env, resume=args.resume, progress=progress)
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        write_result(result_path, None, f"{type(exc).__name__}: {exc}", private=private)
        return ExitCode.ERROR
    except BaseException as exc:  # record why, then let the traceback reach the log
        write_result(result_path, None, f"{type(exc).__name__}: {exc}", private=private)
        raise
    write_result(result_path, live, private=private)
    return ExitCode.INTERRUPTED if live.get("interrupted") else ExitCode.OK


def _standalone(config: Any, args: argparse.Namespace, env: Any, progress: bool) -> int:
    """Started by torchrun: coordinate over a Gloo group; rank 0 prepares and merges."""
    groups = init_process_group("gloo", timeout_s=config.rollout.worker_timeout)
    output: RunOutput | None = None  # rank 0's: it holds the directory's lock until the run's files are written
    try:
        prepared: tuple[str | None, str | None] = (None, None)
        if env.rank == 0:
            try:
                directory = Path(args.output) if args.output else expand_output_dir(config)
                output = RunOutput(directory, resume=args.resume, overwrite=config.output.overwrite, config=config,
                                   force_config=args.force_config)
                output.write_config(config)
                prepared = (str(directory.resolve()), None)
            except ScaffoldError as exc:
                prepared = (None, str(exc))
        directory_text, error = broadcast_object(prepared, src=0)
        if error is not None or directory_text is None:
            if env.rank == 0:
                print(f"error: {error}", file=sys.stderr)
            return ExitCode.ERROR
        directory = Path(directory_text)
        live: dict[str, Any] | None = None
        failure: str | None = None
        try:
            live = run_shard(config, directory, env, resume=args.resume, progress=progress)
        except Exception as exc:  # reported by rank 0 as this rank's failure
            failure = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        gathered = all_gather_objects((live, failure))
        if env.rank != 0:
            return ExitCode.ERROR if failure else ExitCode.OK
        results = [WorkerResult(rank, env.world_size, lv, 0 if err is None else 1, err)
                   for rank, (lv, err) in enumerate(gathered)]
        metrics = finalize_run(config, directory, results, launcher="torchrun")
        print_summary(metrics, as_json=True)  # a worker entry point, read by scripts
        report_failures(metrics)
        return exit_code_for(metrics, config.rollout.max_failed_fraction)
    finally:
        if output is not None:
            output.release()
        groups.destroy()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
