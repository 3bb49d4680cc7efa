"""Multi-worker rollouts: start N worker processes, wait (bounded), merge their shards.

``rollout.workers: N`` (or ``scaffold run --workers N``) runs N copies of
:mod:`scaffold_core.worker`, each in its own process group (``setsid``) with
torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Worker ``r`` runs
the rows with ``index % N == r`` on its own engine and appends them to its
own ledger ``episodes.rank-0000r.jsonl`` in the shared output directory; its
log is ``workers/rank-0000r.log`` and its live metrics
``workers/rank-0000r.json``. When every worker has ended, the launcher merges
the ledgers into ``samples.jsonl``, ``failures.jsonl``, ``trajectories/`` and
``metrics.json`` exactly as a one-process run would.

A worker that fails (non-zero exit, no result, or past
``rollout.worker_timeout``) is reported in ``metrics["worker_failures"]`` by
rank and shard with its exit code and the tail of its log; the other
workers' episodes are kept, and ``--resume`` runs the missing ones. Ctrl-C
(or SIGTERM) is forwarded to every worker, which finishes its in-flight
episodes within ``rollout.shutdown_timeout``; a second Ctrl-C, or that
timeout, kills the workers' process groups.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Config
from .output import atomic_write_text, ledger_paths, rank_ledger_name

WORKERS_DIR = "workers"
RESULT_ENV = "SCAFFOLD_WORKER_RESULT"
PARENT_ENV = "SCAFFOLD_LAUNCHER_PID"
KILL_GRACE_S = 10.0
POLL_S = 0.2
TAIL_CHARS = 4000
EXIT_INTERRUPTED = 130


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
        return f"rows with index % {self.world_size} == {self.rank} (ledger {rank_ledger_name(self.rank)})"

    def failure(self) -> dict[str, Any]:
        return {"rank": self.rank, "shard": self.shard, "exit_code": self.exit_code, "error": self.error,
                "log": self.log, "log_tail": self.log_tail}


def worker_paths(output_dir: Path, rank: int) -> tuple[Path, Path]:
    """(log file, result file) of worker ``rank``."""
    base = Path(output_dir) / WORKERS_DIR / f"rank-{rank:05d}"
    return base.with_suffix(".log"), base.with_suffix(".json")


def write_result(path: Path, live: dict[str, Any] | None, error: str | None = None) -> None:
    """A worker's last word: its live metrics, or the error that stopped it (atomic)."""
    atomic_write_text(path, json.dumps({"live": live, "error": error}, default=str) + "\n")


def read_result(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    return data.get("live"), data.get("error")


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


# ---------------------------------------------------------------------------
# Merging
# ---------------------------------------------------------------------------


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


def finalize_run(config: Config, output_dir: Path, results: list[WorkerResult], *,
                 extra_live: dict[str, Any] | None = None, launcher: str = "local",
                 launcher_wall_s: float | None = None) -> dict[str, Any]:
    """Merge every ledger of ``output_dir`` into the run's derived files and metrics.json; returns the metrics."""
    from .rollout import Rollout

    live = merge_live(results)
    live.update(extra_live or {})
    live["workers"]["launcher"] = launcher
    if launcher_wall_s is not None:  # start-up (model loading) included
        live["workers"]["launcher_wall_s"] = round(launcher_wall_s, 3)
    rollout = Rollout(config, output_dir=output_dir, resume=True, prepared=True, finalize=False, progress=False)
    for reason, count in merged_skipped_rows(results).items():
        rollout.metrics.skipped_rows[reason] += count
    return rollout.finalize(live, ledgers=ledger_paths(output_dir))


def report_failures(metrics: dict[str, Any]) -> None:
    """Tell the user which workers failed, where their logs are, and how to finish the run."""
    for f in metrics.get("worker_failures") or []:
        print(f"scaffold: worker rank {f['rank']} failed ({f['error']}); shard: {f['shard']}; "
              f"log: {f['log']}", file=sys.stderr)
        if f.get("log_tail"):
            lines = f["log_tail"].rstrip().splitlines()[-15:]
            print("  | " + "\n  | ".join(lines), file=sys.stderr)
    if metrics.get("worker_failures"):
        print("scaffold: the other workers' episodes are kept; run the missing ones with --resume",
              file=sys.stderr)


# ---------------------------------------------------------------------------
# Local launcher
# ---------------------------------------------------------------------------


def run_workers(config: Config, *, output_dir: str | Path | None = None, resume: bool = False,
                progress: bool | None = None) -> dict[str, Any]:
    """Run the config on ``rollout.workers`` processes (or Ray actors); return the merged metrics.

    ``metrics["worker_failures"]`` lists failed workers by rank and shard.
    """
    if config.rollout.launcher == "ray":
        from .ray_launcher import run_ray

        return run_ray(config, output_dir=output_dir, resume=resume, progress=progress)
    return LocalLauncher(config, output_dir=output_dir, resume=resume, progress=progress).run()


def default_threads(workers: int) -> int:
    """CPU threads per worker so that N workers do not oversubscribe this machine's cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, workers))


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LocalLauncher:
    """Starts, watches and stops the worker processes of one run on this machine."""

    def __init__(self, config: Config, *, output_dir: str | Path | None = None, resume: bool = False,
                 progress: bool | None = None, python: str | None = None):
        from .rollout import Rollout

        self.config = config
        self.workers = config.rollout.workers
        self.resume = resume
        self.python = python or sys.executable
        # Validates every component and prepares the directory (existing run, --resume, overwrite).
        self.rollout = Rollout(config, output_dir=output_dir, resume=resume, finalize=False, progress=False)
        self.dir = self.rollout.dir.resolve()
        self.progress = config.rollout.progress if progress is None else progress
        self.procs: dict[int, subprocess.Popen] = {}
        self.ended: dict[int, tuple[int | None, str | None]] = {}
        self.interrupted: str | None = None

    # -- starting ----------------------------------------------------------
    def _env(self, rank: int, master_addr: str, master_port: int, result: Path) -> dict[str, str]:
        from .distributed import DistEnv

        env = dict(os.environ)
        env.update(DistEnv(rank, self.workers, rank, self.workers, master_addr, master_port, True).to_env())
        env[RESULT_ENV] = str(result)
        env[PARENT_ENV] = str(os.getpid())
        env.setdefault("OMP_NUM_THREADS", str(default_threads(self.workers)))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _command(self, config_path: Path) -> list[str]:
        cmd = [self.python, "-m", "scaffold_core.worker", str(config_path), "-o", str(self.dir)]
        return cmd + (["--resume"] if self.resume else [])

    def start(self) -> None:
        from .net import loopback_host
        from .ports import control_port_range, reserve_port

        workers_dir = self.dir / WORKERS_DIR
        workers_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.dir / "config.yaml"
        self.rollout.output.write_config(self.config)
        master_addr = loopback_host()
        # Held on every address (as torch's TCP store binds it), released just before the workers start.
        reservation = reserve_port(port_range=control_port_range())
        plans = []
        for rank in range(self.workers):
            log, result = worker_paths(self.dir, rank)
            result.unlink(missing_ok=True)  # a stale result from an earlier session must not count
            plans.append((rank, log, result))
        port = reservation.release()  # handed to the workers; nothing of ours binds it until rank 0 does
        for rank, log, result in plans:
            with open(log, "ab") as fh:
                fh.write(f"--- scaffold worker rank {rank} of {self.workers} started {time.ctime()} ---\n".encode())
                fh.flush()
                self.procs[rank] = subprocess.Popen(
                    self._command(config_path), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                    env=self._env(rank, master_addr, port, result), start_new_session=True, cwd=os.getcwd())

    # -- waiting -----------------------------------------------------------
    def wait(self) -> None:
        """Wait for every worker, bounded by rollout.worker_timeout; Ctrl-C stops them cleanly."""
        deadline = time.monotonic() + self.config.rollout.worker_timeout
        bar = _LedgerProgress(self.dir, self.workers, self.progress)
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
                    time.sleep(POLL_S)
                except KeyboardInterrupt:
                    if self.interrupted is None:
                        self.interrupted = "SIGINT"
                        timeout = self.config.rollout.shutdown_timeout
                        print(f"\nscaffold: interrupted: workers finish their episodes in flight "
                              f"(up to {timeout:g} s); press Ctrl-C again to stop now", file=sys.stderr)
                        for proc in self._running():
                            _kill_group(proc, signal.SIGINT)
                        kill_at = time.monotonic() + timeout + KILL_GRACE_S
                    else:
                        self._stop_all("killed by a second Ctrl-C")
                        break
        finally:
            bar.close()
            self._stop_all("stopped because the launcher stopped")  # no-op when all have ended

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
            if error is None and live is not None and code in (0, EXIT_INTERRUPTED):
                out.append(WorkerResult(rank, self.workers, live, code, None, str(log)))
                continue
            if error is None:
                error = reason or exit_description(code)
            elif code not in (None, 1):
                error = f"{error} ({exit_description(code)})"
            out.append(WorkerResult(rank, self.workers, live, code, error, str(log), tail(log)))
        return out

    def run(self) -> dict[str, Any]:
        print(f"scaffold: writing to {self.dir} with {self.workers} worker processes "
              f"(logs: {self.dir / WORKERS_DIR}/rank-*.log)", file=sys.stderr)
        began = time.perf_counter()
        previous = _sigterm_as_interrupt()
        try:
            self.start()
            self.wait()
        except BaseException:
            self._stop_all("stopped because the launch failed")  # no worker outlives a failed launch
            raise
        finally:
            _restore_sigterm(previous)
        results = self.results()
        extra = {"interrupted": self.interrupted} if self.interrupted else {}
        metrics = finalize_run(self.config, self.dir, results, extra_live=extra,
                               launcher_wall_s=time.perf_counter() - began)
        report_failures(metrics)
        return metrics


def _sigterm_as_interrupt() -> Any:
    """While workers run, SIGTERM to the launcher stops them like Ctrl-C (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, signal.default_int_handler)


def _restore_sigterm(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


class _LedgerProgress:
    """A progress bar over every worker's ledger (counts finished episodes by their lines)."""

    def __init__(self, directory: Path, workers: int, enabled: bool | None):
        self.paths = [directory / rank_ledger_name(r) for r in range(workers)]
        self.offsets = {p: (p.stat().st_size if p.exists() else 0) for p in self.paths}
        self.bar = None
        self.last = 0.0
        if enabled is False:
            return
        from tqdm import tqdm

        self.bar = tqdm(total=None, unit="ep", desc=f"episodes ({workers} workers)",
                        disable=None if enabled is None else False, dynamic_ncols=True, mininterval=0.5)

    def update(self) -> None:
        now = time.monotonic()
        if self.bar is None or now - self.last < 0.5:
            return
        self.last = now
        new = 0
        for path in self.paths:
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets[path])
                    data = fh.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1
            new += data[:cut].count(b"\n")
            self.offsets[path] += cut
        if new:
            self.bar.update(new)

    def close(self) -> None:
        if self.bar is not None:
            self.update()
            self.bar.close()


__all__ = ["WorkerResult", "LocalLauncher", "run_workers", "finalize_run", "merge_live", "worker_paths",
           "write_result", "read_result", "default_threads"]
