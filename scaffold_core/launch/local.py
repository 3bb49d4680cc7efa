"""Multi-worker rollouts: start N worker processes, wait (bounded), merge their shards.

``rollout.workers: N`` (or ``scaffold run --workers N``) runs N copies of
:mod:`scaffold_core.launch.worker`, each in its own process group (``setsid``) with
torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Worker ``r`` runs
the rows with ``index % N == r`` on its own engine and appends them to its
own store ``episodes.rank-0000r.db`` in the shared output directory; its
log is ``workers/rank-0000r.log`` and its live metrics
``workers/rank-0000r.json``. When every worker has ended, the launcher merges
the stores into ``episodes.db`` and exports ``samples.jsonl``, ``failures.jsonl``,
``trajectories/`` and ``metrics.json`` exactly as a one-process run would.

A worker that fails (non-zero exit, no result, or past
``rollout.worker_timeout``) is reported in ``metrics["worker_failures"]`` by
rank and shard with its exit code and the tail of its log; the other
workers' episodes are kept, and ``--resume`` runs the missing ones. Ctrl-C
(or SIGTERM) is forwarded, as the same signal, to every worker, which finishes
its in-flight episodes within ``rollout.shutdown_timeout``; a second signal, or
that timeout, kills the workers' process groups.

The launcher holds the output directory's lock for the whole run. A worker's
output reaches its log through the launcher, with secrets replaced by ``***``
(:mod:`scaffold_core.output.redact`); a worker whose launcher dies (even by
SIGKILL) stops at once (:func:`scaffold_core.launch.worker.die_with_parent`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Config
from ..distributed.env import DistEnv, usable_cores
from ..distributed.net import loopback_host
from ..distributed.ports import control_port_range, reserve_port
from ..errors import ScaffoldError
from ..output import RunOutput, expand_output_dir, rank_store_name
from ..output.files import make_dir, open_append
from ..output.redact import Redactor, copy_redacted, secret_values
from ..output.store import count_episodes
from ..run.summary import ExitCode, report_failures
from .results import (
    PARENT_ENV,
    RESULT_ENV,
    WORKERS_DIR,
    WorkerResult,
    exit_description,
    finalize_run,
    read_result,
    tail,
    worker_paths,
)

KILL_GRACE_S = 10.0
POLL_S = 0.2
#: The module each worker process runs.
WORKER_MODULE = "scaffold_core.launch.worker"


def default_threads(workers: int) -> int:
    """CPU threads per worker so that N workers do not oversubscribe this machine's cores."""
    return max(1, usable_cores() // max(1, workers))


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LocalLauncher:
    """Starts, watches and stops the worker processes of one run on this machine."""

    def __init__(self, config: Config, *, output_dir: str | Path | None = None, resume: bool = False,
                 progress: bool | None = None, python: str | None = None, force_config: bool = False):
        self.config = config
        self.workers = config.rollout.workers
        self.resume = resume
        self.python = python or sys.executable
        # The config was validated when it loaded; this takes the directory's lock (held until run() ends)
        # and checks the directory (existing run, --resume with the saved config, overwrite).
        self.output = RunOutput(Path(output_dir) if output_dir is not None else expand_output_dir(config),
                                resume=resume, overwrite=config.output.overwrite, config=config,
                                force_config=force_config)
        self.dir = self.output.dir.resolve()
        self.progress = config.rollout.progress if progress is None else progress
        self.procs: dict[int, subprocess.Popen] = {}
        self.copiers: dict[int, threading.Thread] = {}
        self.ended: dict[int, tuple[int | None, str | None]] = {}
        self.interrupted: str | None = None
        self._signal: str | None = None  # the signal that raised the last KeyboardInterrupt

    # -- starting ----------------------------------------------------------
    def _env(self, rank: int, master_addr: str, master_port: int, result: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(DistEnv(rank, self.workers, rank, self.workers, master_addr, master_port, True).to_env())
        env[RESULT_ENV] = str(result)
        env[PARENT_ENV] = str(os.getpid())
        env.setdefault("OMP_NUM_THREADS", str(default_threads(self.workers)))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _command(self, config_path: Path) -> list[str]:
        cmd = [self.python, "-m", WORKER_MODULE, str(config_path), "-o", str(self.dir)]
        return cmd + (["--resume"] if self.resume else [])

    def start(self) -> None:
        private = self.config.output.private
        make_dir(self.dir / WORKERS_DIR, private=private)
        config_path = self.dir / "config.yaml"
        self.output.write_config(self.config)
        master_addr = loopback_host()
        # Held on every address (as torch's TCP store binds it), released just before the workers start.
        reservation = reserve_port(port_range=control_port_range())
        plans = []
        for rank in range(self.workers):
            log, result = worker_paths(self.dir, rank)
            result.unlink(missing_ok=True)  # a stale result from an earlier session must not count
            plans.append((rank, log, result))
        redactor = Redactor(secret_values(os.environ, self.config.to_dict()))
        port = reservation.release()  # handed to the workers; nothing of ours binds it until rank 0 does
        for rank, log, result in plans:
            fd = open_append(log, private=private)  # never through a link; 0600 unless output.private is false
            try:
                os.write(fd, f"--- scaffold worker rank {rank} of {self.workers} started {time.ctime()} ---\n".encode())
                proc = subprocess.Popen(
                    self._command(config_path), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, env=self._env(rank, master_addr, port, result), start_new_session=True,
                    cwd=os.getcwd())
            except BaseException:
                os.close(fd)
                raise
            self.procs[rank] = proc
            copier = threading.Thread(target=copy_redacted, args=(proc.stdout, fd, redactor), daemon=True,
                                      name=f"scaffold-log-rank-{rank}")
            copier.start()
            self.copiers[rank] = copier

    # -- waiting -----------------------------------------------------------
    def wait(self) -> None:
        """Wait for every worker, bounded by rollout.worker_timeout; Ctrl-C stops them cleanly."""
        deadline = time.monotonic() + self.config.rollout.worker_timeout
        bar = _StoreProgress(self.dir, self.workers, self.progress)
        kill_at: float | None = None
        try:
            while len(self.ended) < len(self.procs):
                try:
                    self._poll()
                    bar.update()
                    now = time.monotonic()
                    if now > deadline:
                        limit = self.config.rollout.worker_timeout
                        self._stop_all(f"timed out after rollout.worker_timeout={limit:g} s")
                        break
                    if kill_at is not None and now > kill_at:
                        self._stop_all("did not stop within rollout.shutdown_timeout after Ctrl-C")
                        break
                    self._pause(POLL_S)
                except KeyboardInterrupt:
                    name, self._signal = self._signal or "SIGINT", None
                    if self.interrupted is None:
                        self.interrupted = name
                        timeout = self.config.rollout.shutdown_timeout
                        print(f"\nscaffold: {name} received: workers finish their episodes in flight "
                              f"(up to {timeout:g} s); send it again to stop now", file=sys.stderr)
                        for proc in self._running():
                            _kill_group(proc, signal.Signals[name])
                        kill_at = time.monotonic() + timeout + KILL_GRACE_S
                    else:
                        self._stop_all(f"killed by a second {name}")
                        break
        finally:
            bar.close()
            self._stop_all("stopped because the launcher stopped")  # no-op when all have ended
            self._join_copiers()

    def _pause(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking as soon as a running worker (the first) exits: the last worker's end
        is seen at once, not at the next poll."""
        running = self._running()
        if not running:
            return
        try:
            running[0].wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass

    def _join_copiers(self, timeout: float = 5.0) -> None:
        """Wait (bounded) until every worker's output is in its log."""
        deadline = time.monotonic() + timeout
        for copier in self.copiers.values():
            copier.join(max(0.0, deadline - time.monotonic()))

    def _running(self) -> list[subprocess.Popen]:
        return [p for r, p in self.procs.items() if r not in self.ended]

    def _poll(self) -> None:
        for rank, proc in self.procs.items():
            if rank not in self.ended and proc.poll() is not None:
                self.ended[rank] = (proc.returncode, None)

    def _stop_all(self, reason: str) -> None:
        """SIGTERM each running worker's process group, then SIGKILL after a grace period."""
        running = {r: p for r, p in self.procs.items() if r not in self.ended}
        if not running:
            return
        for proc in running.values():
            _kill_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        for rank, proc in running.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _kill_group(proc, signal.SIGKILL)  # its children too, even when the worker itself exited
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            self.ended[rank] = (proc.returncode, reason)

    # -- results -----------------------------------------------------------
    def results(self) -> list[WorkerResult]:
        out = []
        for rank in range(self.workers):
            log, result = worker_paths(self.dir, rank)
            code, reason = self.ended.get(rank, (None, "never ended"))
            live, error = read_result(result)
            if error is None and live is not None and code in (ExitCode.OK, ExitCode.INTERRUPTED):
                out.append(WorkerResult(rank, self.workers, live, code, None, str(log)))
                continue
            if error is None:
                error = reason or exit_description(code)
            elif code not in (None, 1):
                error = f"{error} ({exit_description(code)})"
            out.append(WorkerResult(rank, self.workers, live, code, error, str(log), tail(log)))
        return out

    def run(self, on_head: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Start the workers, wait for them, merge and export the run (``on_head``: see ``run_workers``)."""
        try:
            return self._run(on_head)
        finally:
            self.output.release()  # the directory's lock, held since __init__

    def _run(self, on_head: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
        print(f"scaffold: writing to {self.dir} with {self.workers} worker processes "
              f"(logs: {self.dir / WORKERS_DIR}/rank-*.log)", file=sys.stderr)
        began = time.perf_counter()
        previous = self._signals_as_interrupt()
        try:
            self.start()
            self.wait()
        except BaseException:
            self._stop_all("stopped because the launch failed")  # no worker outlives a failed launch
            self._join_copiers()
            raise
        finally:
            _restore_signals(previous)
        results = self.results()
        extra = {"interrupted": self.interrupted} if self.interrupted else {}
        metrics = finalize_run(self.config, self.dir, results, extra_live=extra,
                               launcher_wall_s=time.perf_counter() - began, on_head=on_head)
        report_failures(metrics)
        return metrics

    def _signals_as_interrupt(self) -> dict[int, Any] | None:
        """While workers run, SIGINT and SIGTERM to the launcher stop them gracefully, each reported (and
        forwarded) as itself (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def interrupt(signum: int, frame: Any) -> None:
            self._signal = signal.Signals(signum).name
            raise KeyboardInterrupt

        return {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signals(previous: dict[int, Any] | None) -> None:
    for sig, handler in (previous or {}).items():
        signal.signal(sig, handler)


class _StoreProgress:
    """Progress over every worker's store (counts the episodes recorded in them): a bar on a terminal, plain
    periodic lines otherwise (:class:`~scaffold_core.run.progress.Progress`)."""

    def __init__(self, directory: Path, workers: int, enabled: bool | None):
        from ..run.progress import Progress

        self.paths = [directory / rank_store_name(r) for r in range(workers)]
        self.seen = {p: self._count(p) for p in self.paths}
        self.last = 0.0
        self.bar = Progress(None, enabled=enabled, desc=f"episodes ({workers} workers)")

    @staticmethod
    def _count(path: Path) -> int:
        try:
            return count_episodes(path)
        except ScaffoldError:  # not readable now (a worker creating it): counted at the next update
            return 0

    def update(self) -> None:
        now = time.monotonic()
        if not self.bar.enabled or now - self.last < 0.5:
            return
        self.last = now
        new = 0
        for path in self.paths:
            count = self._count(path)
            new += max(0, count - self.seen[path])
            self.seen[path] = max(count, self.seen[path])
        self.bar.advance(new)

    def close(self) -> None:
        if self.bar.enabled:
            self.update()
        self.bar.close()
